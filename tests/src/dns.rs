//! A private DNS server for tests: Debian's `dnsmasq` on a free loopback port,
//! answering only the TXT records a test gives it (every other name is
//! NXDOMAIN), killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running dnsmasq.
pub struct Dns {
    child: Child,
    pub port: u16,
}

impl Dns {
    /// Serves `records` as (name, text) TXT records.
    pub fn start(records: &[(&str, &str)]) -> Dns {
        for attempt in 0..5 {
            let port = crate::free_port();
            let mut cmd = Command::new("dnsmasq");
            cmd.args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--pid-file=",
                // Everything else is NXDOMAIN, not REFUSED (DMARC walks parent names).
                "--local=/#/",
            ])
            .arg(format!("--port={port}"));
            if is_root() {
                cmd.arg("--user=nobody");
            }
            for (name, text) in records {
                // dnsmasq splits a value at commas into strings (and keeps quotes
                // literally), so a record's text must not contain one.
                assert!(!text.contains(','), "TXT text with a comma: {text}");
                cmd.arg(format!("--txt-record={name},{text}"));
            }
            let child = match cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    panic!("dnsmasq is not installed (Debian: apt-get install -y dnsmasq-base)")
                }
                Err(e) => panic!("cannot start dnsmasq: {e}"),
            };
            let mut dns = Dns { child, port };
            if dns.answers() {
                return dns;
            }
            eprintln!("dnsmasq attempt {attempt} on port {port} failed; retrying");
        }
        panic!("dnsmasq did not start after 5 attempts");
    }

    /// `ip:port` for a resolver setting.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Waits until a TCP query for a name gets an answer.
    fn answers(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
