//! The approval page in-process, a real Prometheus, and a real browser
//! (Debian's `chromium` driven through `chromedriver` over WebDriver).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use broker::shutdown::Trigger;
use broker::Shutdown;

use crate::{free_port, wait_until, Deployment};

/// Writes an Argon2 hash of `password` where `[web.users.NAME] password_file` points.
pub fn write_password(path: &Path, password: &str) {
    std::fs::write(path, web::auth::hash_password(password)).expect("write password hash");
}

/// `cowboy web` serving a deployment, as a task on a free loopback port.
pub struct WebServer {
    pub addr: std::net::SocketAddr,
    trigger: Trigger,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl WebServer {
    /// The page (and `/metrics`) of `d`, whose `[web]` users' hash files exist.
    pub async fn start(d: &Deployment) -> WebServer {
        let app = web::App::new(d.config.clone(), broker::Clock::system())
            .await
            .unwrap_or_else(|e| panic!("web app: {e}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (trigger, shutdown) = Shutdown::new();
        let task = tokio::spawn(web::serve(app, listener, shutdown, true));
        WebServer {
            addr,
            trigger,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn stop(self) {
        self.trigger.fire();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// A private Prometheus scraping `target` (host:port) every second.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: cowboy\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus (Debian package `prometheus`)");
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// The value of an instant query, when it has exactly one series.
    pub async fn query(&self, expr: &str) -> Option<f64> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let body: serde_json::Value = reqwest::Client::new()
            .get(url)
            .query(&[("query", expr)])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let result = body["data"]["result"].as_array()?;
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium behind chromedriver, and its WebDriver session.
pub struct Browser {
    pub client: fantoccini::Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver (Debian package `chromium-driver`)");
        let profile = tempfile::tempdir().expect("profile dir");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=420,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let client = wait_until(
            "chromedriver to accept a session",
            Duration::from_secs(30),
            || {
                let caps = caps.clone();
                let url = url.clone();
                async move {
                    fantoccini::ClientBuilder::native()
                        .capabilities(caps)
                        .connect(&url)
                        .await
                        .ok()
                }
            },
        )
        .await;
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}
