//! Test deployments built rather than edited: the standard approval setup
//! with the changes a test needs named, instead of string surgery on TOML.

/// The standard approval deployment: a requesting bridge `mail` (approval
/// required, asking through `desk`, approvers `console:boss` and `cli:op`),
/// the approval surface `desk` (destination `ops`), and one agent `ann`.
#[derive(Debug, Clone)]
pub struct Setup {
    timeout: u64,
    approvers: Vec<String>,
    approval: Vec<String>,
    mail: Vec<String>,
    desk: Vec<String>,
    desk_destinations: Vec<String>,
    agents: Vec<String>,
    tail: String,
}

impl Setup {
    /// The standard setup with approval timeout `timeout` seconds (0: none).
    pub fn approval(timeout: u64) -> Setup {
        Setup {
            timeout,
            approvers: vec!["console:boss".into(), "cli:op".into()],
            approval: Vec::new(),
            mail: Vec::new(),
            desk: Vec::new(),
            desk_destinations: vec!["ops".into()],
            agents: vec!["ann".into()],
            tail: String::new(),
        }
    }

    /// `mail`'s approvers, instead of boss and op.
    pub fn approvers(mut self, approvers: &[&str]) -> Setup {
        self.approvers = approvers.iter().map(|a| a.to_string()).collect();
        self
    }

    /// One more key of `mail`'s approval table (`"quorum = 2"`).
    pub fn approval_key(mut self, key: &str) -> Setup {
        self.approval.push(key.to_string());
        self
    }

    /// One more line of `[bridges.mail]` (`"latency_ms = 2000"`).
    pub fn mail(mut self, line: &str) -> Setup {
        self.mail.push(line.to_string());
        self
    }

    /// One more line of `[bridges.desk]`.
    pub fn desk(mut self, line: &str) -> Setup {
        self.desk.push(line.to_string());
        self
    }

    /// `desk`'s destinations, instead of `ops`.
    pub fn desk_destinations(mut self, destinations: &[&str]) -> Setup {
        self.desk_destinations = destinations.iter().map(|d| d.to_string()).collect();
        self
    }

    /// One more agent.
    pub fn agent(mut self, name: &str) -> Setup {
        self.agents.push(name.to_string());
        self
    }

    /// More tables after the standard ones (people, operators, `[web]`).
    pub fn with(mut self, toml: &str) -> Setup {
        self.tail.push('\n');
        self.tail.push_str(toml);
        self
    }

    /// The config's text (`{dir}` is the deployment's directory).
    pub fn toml(&self) -> String {
        let list = |items: &[String]| {
            let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
            quoted.join(", ")
        };
        let lines = |items: &[String]| items.iter().map(|l| format!("{l}\n")).collect::<String>();
        let mut approval = vec![
            "required = true".to_string(),
            "notify = \"desk\"".to_string(),
            "notify_channel = \"ops\"".to_string(),
            format!("timeout = {}", self.timeout),
            format!("approvers = [{}]", list(&self.approvers)),
        ];
        approval.extend(self.approval.iter().cloned());
        let agents: String = self
            .agents
            .iter()
            .map(|a| format!("[agents.{a}]\n\n"))
            .collect();
        format!(
            "\n{agents}[bridges.mail]\ntype = \"console\"\noutput = \"{{dir}}/mail.out\"\ninput = \"{{dir}}/mail.in\"\ndestinations = [\"*\"]\napproval = {{ {} }}\n{}\n[bridges.desk]\ntype = \"console\"\noutput = \"{{dir}}/desk.out\"\ninput = \"{{dir}}/desk.in\"\ndestinations = [{}]\n{}{}",
            approval.join(", "),
            lines(&self.mail),
            list(&self.desk_destinations),
            lines(&self.desk),
            self.tail,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's standard setup is the config the tests were written
    /// against, and each change lands where its name says.
    #[test]
    fn the_standard_setup_and_its_changes() {
        let parse = |t: &str| t.parse::<toml::Table>().unwrap();
        let standard = parse(&Setup::approval(60).toml());
        let mail = standard["bridges"]["mail"].as_table().unwrap();
        assert_eq!(mail["approval"]["notify"].as_str(), Some("desk"));
        assert_eq!(mail["approval"]["timeout"].as_integer(), Some(60));
        assert_eq!(mail["approval"]["approvers"].as_array().unwrap().len(), 2);
        assert_eq!(
            standard["bridges"]["desk"]["destinations"][0].as_str(),
            Some("ops")
        );
        assert!(standard["agents"].get("ann").is_some());
        let changed = parse(
            &Setup::approval(0)
                .approvers(&["web:boss"])
                .approval_key("quorum = 2")
                .mail("latency_ms = 5")
                .desk("batch = 7")
                .desk_destinations(&["a", "b"])
                .agent("bob")
                .with("[people.boss]\nidentities = [\"web:boss\"]\n")
                .toml(),
        );
        let mail = changed["bridges"]["mail"].as_table().unwrap();
        assert_eq!(mail["approval"]["quorum"].as_integer(), Some(2));
        assert_eq!(mail["approval"]["approvers"][0].as_str(), Some("web:boss"));
        assert_eq!(mail["latency_ms"].as_integer(), Some(5));
        let desk = changed["bridges"]["desk"].as_table().unwrap();
        assert_eq!(desk["batch"].as_integer(), Some(7));
        assert_eq!(desk["destinations"].as_array().unwrap().len(), 2);
        assert!(changed["agents"].get("bob").is_some() && changed.get("people").is_some());
    }
}
