//! A private mail stack per test: Postfix (SMTP) hands mail over LMTP to a
//! private Dovecot that serves IMAP with IDLE. Own config folder, queue, maildirs
//! and free loopback ports; never the system's instances. Postfix needs root.
//!
//! Domain `bridge.test`; users `bridge` (the bridge's mailbox), `approver`,
//! `stranger`, `bob`, each with password `<user>-secret`. Only 127.0.0.1 may
//! send without AUTH, and only to `bridge.test`: anything else is refused with
//! 554 (relay access denied), which gives the tests a real permanent failure.
//! Mail from the SASL user `approver` gets an `Authentication-Results` header
//! from `mx.bridge.test` (as a DKIM/DMARC-checking server would add).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The users of the stack.
pub const USERS: &[&str] = &["bridge", "approver", "stranger", "bob"];
/// The authserv-id in the Authentication-Results headers Postfix adds.
pub const AUTHSERV: &str = "mx.bridge.test";

/// A running Postfix + Dovecot pair.
pub struct MailStack {
    pub dir: tempfile::TempDir,
    pub smtp_port: u16,
    pub imap_port: u16,
    lmtp_port: u16,
    /// With [`MailStack::start_tls`]: the TLS ports and the CAs.
    pub tls: Option<TlsPorts>,
    /// With [`MailStack::start_without_idle`]: Dovecot does not offer IDLE.
    no_idle: bool,
}

/// The TLS side of a stack started with [`MailStack::start_tls`]. The server
/// certificate is for `localhost` only (so `127.0.0.1` is a wrong host name),
/// signed by `ca`; `other_ca` signed nothing the servers present. The plain
/// ports of the stack offer STARTTLS.
pub struct TlsPorts {
    /// SMTP with TLS from the first byte.
    pub smtps_port: u16,
    /// IMAP with TLS from the first byte.
    pub imaps_port: u16,
    /// SMTP that offers no STARTTLS.
    pub smtp_plain_port: u16,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
}

/// Makes a CA (`{name}-ca.pem`) in `dir`; with `server`, also a certificate and
/// key for `localhost` signed by it (`server.pem`, `server.key`).
fn make_ca(dir: &Path, name: &str, server: bool) -> PathBuf {
    make_ca_for(dir, name, server.then_some("DNS:localhost"))
}

/// [`make_ca`] with the server certificate's subject alternative names
/// (`DNS:localhost,IP:127.0.0.1`), or no server certificate.
pub fn make_ca_for(dir: &Path, name: &str, server: Option<&str>) -> PathBuf {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (Debian package openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let (ca, ca_key) = (format!("{name}-ca.pem"), format!("{name}-ca.key"));
    let subject = format!("/CN=cowboy test {name} CA");
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
    args.extend(ec);
    args.extend([
        "-keyout",
        &ca_key,
        "-out",
        &ca,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&args);
    if let Some(sans) = server {
        let mut args = vec![
            "req",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ];
        args.extend(ec);
        run(&args);
        std::fs::write(
            dir.join("server.ext"),
            format!(
                "subjectAltName={sans}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ]);
    }
    dir.join(ca)
}

/// A client certificate (`client.pem`, `client.key`) signed by the CA
/// `make_ca_for(dir, ca_name, ..)` made, for servers that verify clients.
pub fn make_client_cert(dir: &Path, ca_name: &str) -> (PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (Debian package openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-subj",
        "/CN=cowboy test client",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
    ]);
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .expect("write client.ext");
    let (ca, ca_key) = (format!("{ca_name}-ca.pem"), format!("{ca_name}-ca.key"));
    run(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "client.ext",
        "-out",
        "client.pem",
    ]);
    (dir.join("client.pem"), dir.join("client.key"))
}

fn wait_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on 127.0.0.1:{port}");
}

/// Runs a daemon's start command with stdio detached (a daemon that keeps an
/// inherited pipe open would make waiting for its output hang).
fn quietly(cmd: &mut Command) -> std::process::ExitStatus {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
}

fn need(program: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{program} is missing: install postfix, dovecot-imapd and dovecot-lmtpd (as .ci/run does)"
    );
}

impl MailStack {
    /// Starts Dovecot and Postfix.
    pub fn start() -> MailStack {
        MailStack::start_with(false, false)
    }

    /// Starts Dovecot without IDLE among its capabilities (as some servers
    /// are), and Postfix: a client must poll.
    pub fn start_without_idle() -> MailStack {
        MailStack::start_with(false, true)
    }

    /// Starts Dovecot and Postfix with TLS on every port but LMTP: STARTTLS
    /// on the plain ports, and implicit TLS and a no-STARTTLS SMTP beside them
    /// (see [`TlsPorts`]).
    pub fn start_tls() -> MailStack {
        MailStack::start_with(true, false)
    }

    fn start_with(tls: bool, no_idle: bool) -> MailStack {
        need("dovecot");
        need("postfix");
        let dir = tempfile::tempdir().unwrap();
        let tls = tls.then(|| {
            let t = dir.path().join("tls");
            std::fs::create_dir_all(&t).unwrap();
            TlsPorts {
                smtps_port: crate::free_port(),
                imaps_port: crate::free_port(),
                smtp_plain_port: crate::free_port(),
                ca: make_ca(&t, "mail", true),
                other_ca: make_ca(&t, "other", false),
            }
        });
        let mut stack = MailStack {
            dir,
            smtp_port: crate::free_port(),
            imap_port: crate::free_port(),
            lmtp_port: crate::free_port(),
            tls,
            no_idle,
        };
        // A free port can be taken by a test running beside this one before
        // Dovecot binds it: try again on others.
        let mut attempt = 0;
        while !stack.start_dovecot() {
            attempt += 1;
            assert!(
                attempt < 5,
                "dovecot failed to start 5 times; see {}/dovecot/dovecot.log",
                stack.d().display()
            );
            stack.imap_port = crate::free_port();
            stack.lmtp_port = crate::free_port();
            if let Some(t) = &mut stack.tls {
                t.imaps_port = crate::free_port();
            }
        }
        stack.start_postfix();
        stack
    }

    fn d(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn dovecot_conf(&self) -> PathBuf {
        self.d().join("dovecot/dovecot.conf")
    }

    fn start_dovecot(&self) -> bool {
        let d = self.d();
        let (user, group) = ("nobody", "nogroup");
        std::fs::create_dir_all(d.join("dovecot")).unwrap();
        std::fs::create_dir_all(d.join("mail")).unwrap();
        Command::new("chown")
            .arg(format!("{user}:{group}"))
            .arg(d.join("mail"))
            .status()
            .unwrap();
        let users: String = USERS
            .iter()
            .map(|u| format!("{u}@bridge.test:{{PLAIN}}{u}-secret::::::\n"))
            .collect();
        std::fs::write(d.join("dovecot/users"), users).unwrap();
        let (ssl, imaps) = match &self.tls {
            Some(t) => (
                format!(
                    "yes\nssl_cert = <{d}/tls/server.pem\nssl_key = <{d}/tls/server.key",
                    d = d.display()
                ),
                t.imaps_port,
            ),
            None => ("no".to_string(), 0),
        };
        let conf = format!(
            r#"base_dir = {d}/dovecot/run
state_dir = {d}/dovecot/state
instance_name = cowboy-{imap}
log_path = {d}/dovecot/dovecot.log
protocols = imap lmtp
listen = 127.0.0.1
ssl = {ssl}
{capability}disable_plaintext_auth = no
default_internal_user = {user}
default_internal_group = {group}
default_login_user = {user}
mail_uid = {user}
mail_gid = {group}
mail_location = maildir:{d}/mail/%d/%n/Maildir
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/dovecot/users
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {d}/dovecot/users
  default_fields = home={d}/mail/%d/%n
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    port = {imap}
  }}
  inet_listener imaps {{
    port = {imaps}
    ssl = yes
  }}
}}
service anvil {{
  chroot =
}}
service lmtp {{
  inet_listener lmtp {{
    port = {lmtp}
  }}
}}
service auth {{
  unix_listener auth-postfix {{
    mode = 0666
  }}
}}
"#,
            d = d.display(),
            imap = self.imap_port,
            lmtp = self.lmtp_port,
            capability = if self.no_idle {
                "imap_capability = IMAP4rev1 SASL-IR LOGIN-REFERRALS ID ENABLE LITERAL+\n"
            } else {
                ""
            },
        );
        std::fs::write(self.dovecot_conf(), conf).unwrap();
        // Dovecot keeps inherited stdio open after daemonising: never capture it.
        quietly(Command::new("dovecot").arg("-c").arg(self.dovecot_conf())).success() && {
            self.wait_dovecot();
            true
        }
    }

    fn run_dovecot(&self) {
        let status = quietly(Command::new("dovecot").arg("-c").arg(self.dovecot_conf()));
        assert!(
            status.success(),
            "dovecot failed to start; see {}/dovecot/dovecot.log",
            self.d().display()
        );
        self.wait_dovecot();
    }

    fn wait_dovecot(&self) {
        wait_port(self.imap_port, "dovecot imap");
        wait_port(self.lmtp_port, "dovecot lmtp");
        if let Some(t) = &self.tls {
            wait_port(t.imaps_port, "dovecot imaps");
        }
    }

    fn start_postfix(&self) {
        let d = self.d();
        let p = d.join("postfix");
        std::fs::create_dir_all(&p).unwrap();
        std::fs::create_dir_all(d.join("postfix-spool")).unwrap();
        std::fs::create_dir_all(d.join("postfix-data")).unwrap();
        Command::new("chown")
            .arg("postfix")
            .arg(d.join("postfix-data"))
            .status()
            .unwrap();
        let main = format!(
            r#"compatibility_level = 3.6
queue_directory = {d}/postfix-spool
data_directory = {d}/postfix-data
maillog_file = {d}/postfix/postfix.log
maillog_file_prefixes = {d}
myhostname = mx.bridge.test
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.2/32
smtpd_relay_restrictions = permit_mynetworks, permit_sasl_authenticated, reject_unauth_destination
smtpd_sender_restrictions = check_sasl_access inline:{{{{ approver@bridge.test = PREPEND Authentication-Results: {authserv}; dkim=pass header.d=bridge.test; dmarc=pass header.from=bridge.test }}}}
virtual_mailbox_domains = bridge.test
virtual_transport = lmtp:inet:127.0.0.1:{lmtp}
smtpd_sasl_auth_enable = yes
smtpd_sasl_type = dovecot
smtpd_sasl_path = {d}/dovecot/run/auth-postfix
default_transport = error:no outbound mail in tests
relay_transport = error:no outbound mail in tests
alias_maps =
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
{tls}"#,
            d = d.display(),
            lmtp = self.lmtp_port,
            authserv = AUTHSERV,
            tls = match &self.tls {
                Some(_) => format!(
                    "smtpd_tls_cert_file = {d}/tls/server.pem\nsmtpd_tls_key_file = {d}/tls/server.key\nsmtpd_tls_security_level = may\nsmtpd_tls_loglevel = 1\n",
                    d = d.display()
                ),
                None => String::new(),
            },
        );
        let tls_services = match &self.tls {
            Some(t) => format!(
                "127.0.0.1:{} inet  n - n - - smtpd -o smtpd_tls_wrappermode=yes\n127.0.0.1:{} inet  n - n - - smtpd -o smtpd_tls_security_level=none\ntlsmgr   unix  - - n 1000? 1 tlsmgr\n",
                t.smtps_port, t.smtp_plain_port
            ),
            None => String::new(),
        };
        let master = format!(
            "127.0.0.1:{smtp} inet  n - n - - smtpd\n{tls_services}{}",
            [
                "pickup   unix  n - n 60 1 pickup",
                "cleanup  unix  n - n - 0 cleanup",
                "qmgr     unix  n - n 300 1 qmgr",
                "rewrite  unix  - - n - - trivial-rewrite",
                "bounce   unix  - - n - 0 bounce",
                "defer    unix  - - n - 0 bounce",
                "trace    unix  - - n - 0 bounce",
                "verify   unix  - - n - 1 verify",
                "flush    unix  n - n 1000? 0 flush",
                "proxymap unix  - - n - - proxymap",
                "showq    unix  n - n - - showq",
                "error    unix  - - n - - error",
                "retry    unix  - - n - - error",
                "discard  unix  - - n - - discard",
                "lmtp     unix  - - n - - lmtp",
                "anvil    unix  - - n - 1 anvil",
                "scache   unix  - - n - 1 scache",
                "postlog  unix-dgram n - n - 1 postlogd",
            ]
            .join("\n")
                + "\n",
            smtp = self.smtp_port
        );
        std::fs::write(p.join("main.cf"), main).unwrap();
        std::fs::write(p.join("master.cf"), master).unwrap();
        // Postfix stalls ~2 s on config files younger than a second.
        Command::new("touch")
            .args(["-d", "-1 min"])
            .arg(p.join("main.cf"))
            .arg(p.join("master.cf"))
            .status()
            .unwrap();
        let status = quietly(Command::new("postfix").arg("-c").arg(&p).arg("start"));
        assert!(
            status.success(),
            "postfix failed to start (needs root); see {}/postfix/postfix.log",
            d.display()
        );
        wait_port(self.smtp_port, "postfix smtpd");
        if let Some(t) = &self.tls {
            wait_port(t.smtps_port, "postfix smtps");
            wait_port(t.smtp_plain_port, "postfix smtpd without STARTTLS");
        }
    }

    /// Postfix's log so far.
    pub fn postfix_log(&self) -> String {
        std::fs::read_to_string(self.d().join("postfix/postfix.log")).unwrap_or_default()
    }

    /// Asks Postfix to try every queued mail now (`postqueue -f`), as an
    /// administrator would after an outage. Postfix alone can strand a mail
    /// for minutes: when its queue manager finds a mail still locked by the
    /// delivery agent that is deferring it ("skipped, still being
    /// delivered"), it sets the mail aside for 60 s in the incoming queue,
    /// which it scans again only when new mail arrives or every 300 s.
    pub fn flush_queue(&self) {
        let flushed = quietly(
            Command::new("postqueue")
                .arg("-c")
                .arg(self.d().join("postfix"))
                .arg("-f"),
        );
        // Said, not failed on: a flush refused would show as mail the soak
        // then counts as lost, and this names why.
        if !flushed.success() {
            eprintln!("postqueue -f failed ({flushed}): Postfix's queue was not flushed");
        }
    }

    /// Postfix's queue as `postqueue -p` lists it.
    pub fn queue_listing(&self) -> String {
        Command::new("postqueue")
            .arg("-c")
            .arg(self.d().join("postfix"))
            .arg("-p")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Stops Dovecot and waits until it is gone.
    pub fn stop_dovecot(&self) {
        stop_master(&self.d().join("dovecot/run/master.pid"));
    }

    /// Stops Postfix (what it queued stays in its spool) and starts it again
    /// on the same ports.
    pub fn restart_postfix(&self) {
        stop_master(&self.d().join("postfix-spool/pid/master.pid"));
        self.start_postfix();
    }

    /// Starts Dovecot again on the same ports.
    pub fn restart_dovecot(&self) {
        self.stop_dovecot();
        self.run_dovecot();
    }

    /// Raw mails delivered to `user`, oldest first.
    pub fn mails(&self, user: &str) -> Vec<Vec<u8>> {
        let base = self.d().join(format!("mail/bridge.test/{user}/Maildir"));
        let mut files: Vec<(std::time::SystemTime, String, PathBuf)> = Vec::new();
        for sub in ["new", "cur"] {
            if let Ok(rd) = std::fs::read_dir(base.join(sub)) {
                for e in rd.flatten() {
                    // Dovecot renames files between new/ and cur/ and expunges
                    // them; one gone since the listing is simply not counted.
                    let Ok(modified) = e.metadata().and_then(|m| m.modified()) else {
                        continue;
                    };
                    files.push((
                        modified,
                        e.file_name().to_string_lossy().into_owned(),
                        e.path(),
                    ));
                }
            }
        }
        files.sort();
        files
            .into_iter()
            .filter_map(|(_, _, p)| std::fs::read(p).ok())
            .collect()
    }

    /// Drops `raw` into `user`'s Maildir the way a delivery agent does (written
    /// in `tmp/`, renamed into `new/`), without Postfix: for backlogs.
    /// `n` orders the names, as a delivery agent's timestamps do.
    pub fn deliver_directly(&self, user: &str, n: u64, raw: &[u8]) {
        let base = self.d().join(format!("mail/bridge.test/{user}/Maildir"));
        for sub in ["tmp", "new", "cur"] {
            std::fs::create_dir_all(base.join(sub)).unwrap();
        }
        let name = format!("{}.M{n}P1.backlog", 1_700_000_000 + n);
        std::fs::write(base.join("tmp").join(&name), raw).unwrap();
        std::fs::rename(base.join("tmp").join(&name), base.join("new").join(&name)).unwrap();
    }

    /// The file the bridge reads a password from.
    pub fn password_file(&self, user: &str) -> PathBuf {
        let path = self.d().join(format!("{user}.password"));
        std::fs::write(&path, format!("{user}-secret\n")).unwrap();
        path
    }

    /// Config for an email bridge whose mailbox is `bridge@bridge.test` (TOML lines).
    pub fn bridge_settings(&self) -> String {
        format!(
            "from = \"bridge@bridge.test\"\nsmtp = {{ host = \"127.0.0.1\", port = {smtp}, tls = \"none\" }}\nimap = {{ host = \"127.0.0.1\", port = {imap}, tls = \"none\", username = \"bridge@bridge.test\", password_file = \"{pw}\" }}\n",
            smtp = self.smtp_port,
            imap = self.imap_port,
            pw = self.password_file("bridge").display(),
        )
    }

    /// Sends a raw message through Postfix, optionally authenticated as `auth_user`.
    pub fn send_raw(&self, from: &str, to: &str, raw: &str, auth_user: Option<&str>) {
        self.try_send_raw(from, to, raw, auth_user)
            .expect("SMTP send from the test");
    }

    /// [`Self::send_raw`], with Postfix's refusal (or its absence) as an error.
    pub fn try_send_raw(
        &self,
        from: &str,
        to: &str,
        raw: &str,
        auth_user: Option<&str>,
    ) -> Result<(), String> {
        use lettre::Transport;
        let mut builder =
            lettre::SmtpTransport::builder_dangerous("127.0.0.1").port(self.smtp_port);
        if let Some(u) = auth_user {
            builder =
                builder.credentials(lettre::transport::smtp::authentication::Credentials::new(
                    format!("{u}@bridge.test"),
                    format!("{u}-secret"),
                ));
        }
        let envelope =
            lettre::address::Envelope::new(Some(from.parse().unwrap()), vec![to.parse().unwrap()])
                .unwrap();
        builder
            .build()
            .send_raw(&envelope, raw.as_bytes())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Stops the daemon whose master process id is in `pidfile` (SIGTERM) and
/// waits until it is gone, so its ports are free again.
fn stop_master(pidfile: &Path) {
    if let Ok(pid) = std::fs::read_to_string(pidfile) {
        let pid = pid.trim().to_string();
        Command::new("kill").arg(&pid).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for MailStack {
    fn drop(&mut self) {
        quietly(
            Command::new("postfix")
                .arg("-c")
                .arg(self.d().join("postfix"))
                .arg("stop"),
        );
        self.stop_dovecot();
    }
}
