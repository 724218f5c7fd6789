//! Harness of the end-to-end tests: a real `terrace daemon` in a temporary
//! folder, the CLI pointed at it, sparse disk files, and guards for the
//! external tools (nbdfuse mounts, loop devices, filesystem mounts) that
//! clean up on drop, also when a test panics.
//!
//! Every external command runs with a timeout in its own process group, so
//! a hang fails the test instead of blocking the suite, and every failure
//! prints the command with its output.

// Each test binary uses a different part of the harness.
#![allow(dead_code)]

pub mod nbd;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use wait_timeout::ChildExt;

pub const TERRACE: &str = env!("CARGO_BIN_EXE_terrace");
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Longest any single external command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);
/// Longest the daemon may take to answer after start, or to stop.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(60);

/// Print a line the test runner does not capture (skips must be seen).
pub fn note(message: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// Where `tool` is: on PATH, or in the sbin folders root's tools live in.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `Command` for an external tool found by [`tool`] (or by PATH as a last resort).
pub fn command(name: &str) -> Command {
    Command::new(tool(name).unwrap_or_else(|| PathBuf::from(name)))
}

/// True (after printing `SKIPPED: <tool> missing`) when one of `tools` is
/// not installed; the test then returns without checking anything.
pub fn skip_without(test: &str, tools: &[&str]) -> bool {
    for name in tools {
        if tool(name).is_none() {
            note(format!("SKIPPED: {name} missing ({test} needs it)"));
            return true;
        }
    }
    false
}

/// The outcome of one external command.
pub struct Run {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn describe(&self) -> String {
        format!(
            "command: {}\nstatus: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            self.status,
            tail(&self.stdout, 200),
            tail(&self.stderr, 200)
        )
    }

    /// Panic with the command and its output unless it exited 0.
    #[track_caller]
    pub fn check(self) -> Run {
        assert!(self.success(), "command failed\n{}", self.describe());
        self
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("output is not JSON ({error})\n{}", self.describe()))
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let skipped = all.len().saturating_sub(lines);
    let mut out = String::new();
    if skipped > 0 {
        out.push_str(&format!("[... {skipped} lines ...]\n"));
    }
    out.push_str(&all[skipped..].join("\n"));
    out
}

fn describe(command: &Command) -> String {
    format!("{command:?}")
}

fn collect(mut source: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buffer = Vec::new();
        let _ = source.read_to_end(&mut buffer);
        buffer
    })
}

/// Signal a whole process group.
fn kill_group(child: &Child, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is shared.
    unsafe {
        libc::kill(-(child.id() as i32), signal);
    }
}

/// Run `command` with `input` on its standard input (none: /dev/null),
/// killing it (and its process group) after `timeout`.
pub fn run_with(command: &mut Command, input: Option<&[u8]>, timeout: Duration) -> Run {
    let text = describe(command);
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = command
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {text}: {error}"));
    let feeder = input.map(|data| {
        let mut stdin = child.stdin.take().expect("stdin piped");
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        })
    });
    let stdout = collect(child.stdout.take().expect("stdout piped"));
    let stderr = collect(child.stderr.take().expect("stderr piped"));
    let status = match child.wait_timeout(timeout).expect("wait for child") {
        Some(status) => status,
        None => {
            kill_group(&child, libc::SIGKILL);
            let _ = child.wait();
            let out = String::from_utf8_lossy(&stdout.join().unwrap_or_default()).into_owned();
            let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
            panic!(
                "command timed out after {timeout:?}: {text}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                tail(&out, 100),
                tail(&err, 100)
            );
        }
    };
    // Whatever the command left running in its group must not hold our pipes.
    kill_group(&child, libc::SIGKILL);
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    Run {
        command: text,
        status,
        stdout: String::from_utf8_lossy(&stdout.join().unwrap_or_default()).into_owned(),
        stderr: String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned(),
    }
}

pub fn run(command: &mut Command) -> Run {
    run_with(command, None, COMMAND_TIMEOUT)
}

/// Run and require exit status 0.
#[track_caller]
pub fn run_ok(command: &mut Command) -> Run {
    run(command).check()
}

/// Poll `ready` until it answers `Some` or `timeout` passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic pseudo-random bytes, different per seed.
pub fn random_bytes(seed: u64, length: usize) -> Vec<u8> {
    terrace_engine::io::random::SplitMix64::new(seed).bytes(length)
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the first `length` bytes of a file (all of it if `None`).
pub fn sha256_file(path: &Path, length: Option<u64>) -> String {
    let mut file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut left = length.unwrap_or(u64::MAX);
    let mut buffer = vec![0u8; 1 << 20];
    while left > 0 {
        let want = buffer
            .len()
            .min(usize::try_from(left).unwrap_or(usize::MAX));
        let read = file
            .read(&mut buffer[..want])
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        left -= read as u64;
    }
    hex(&hasher.finalize())
}

/// A fingerprint of a (sparse) file's content: its length and every
/// non-zero 4 KiB block with its offset. Holes and written zeroes look the
/// same, so only a change of content changes it; holes are skipped, so a
/// large sparse file costs only what is written in it.
pub fn content_fingerprint(path: &Path) -> String {
    let file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let length = file.metadata().expect("metadata").len();
    let mut hasher = Sha256::new();
    hasher.update(length.to_le_bytes());
    let fd = file.as_raw_fd();
    let mut position: u64 = 0;
    let mut block = vec![0u8; 4096];
    while position < length {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let data = unsafe { libc::lseek(fd, position as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no data after `position`
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let (start, end) = (
            (data as u64) / 4096 * 4096,
            (hole.max(data) as u64).min(length),
        );
        let mut offset = start;
        while offset < end {
            let want = (end - offset).min(4096) as usize;
            file.read_exact_at(&mut block[..want], offset)
                .expect("read block");
            if block[..want].iter().any(|&b| b != 0) {
                hasher.update(offset.to_le_bytes());
                hasher.update(&block[..want]);
            }
            offset += want as u64;
        }
        position = end.max(position + 1);
    }
    hex(&hasher.finalize())
}

/// Create a sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let file = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    file.set_len(size).expect("set_len");
}

/// The five layouts every client test runs on.
pub struct LayoutCase {
    /// Space (and export) name.
    pub name: &'static str,
    pub args: &'static [&'static str],
    /// The API's layout_description.
    pub description: &'static str,
}

pub const LAYOUTS: [LayoutCase; 5] = [
    LayoutCase {
        name: "simple",
        args: &["--layout", "simple"],
        description: "simple",
    },
    LayoutCase {
        name: "mirror2",
        args: &["--layout", "mirror", "--copies", "2"],
        description: "2-way mirror",
    },
    LayoutCase {
        name: "mirror3",
        args: &["--layout", "mirror", "--copies", "3"],
        description: "3-way mirror",
    },
    LayoutCase {
        name: "parity1",
        args: &["--layout", "parity", "--redundancy", "1"],
        description: "single parity",
    },
    LayoutCase {
        name: "parity2",
        args: &["--layout", "parity", "--redundancy", "2"],
        description: "dual parity",
    },
];

/// A `terrace daemon` in a temporary folder: state, control socket, NBD
/// Unix socket and log all inside it; NBD TCP on a free local port.
pub struct Daemon {
    dir: tempfile::TempDir,
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub control: PathBuf,
    pub nbd_socket: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    /// The bound NBD TCP address, from `terrace --json status`.
    pub tcp: Option<String>,
    /// More arguments to `terrace daemon`, at every start.
    extra: Vec<String>,
    /// Whether `--nbd-socket` is passed; without it the daemon chooses.
    pub pass_nbd_socket: bool,
}

impl Daemon {
    pub fn start() -> Daemon {
        Daemon::start_with(&[])
    }

    /// A daemon started with more arguments (kept across restarts).
    pub fn start_with(extra: &[&str]) -> Daemon {
        let mut daemon = Daemon::prepare(extra);
        daemon.launch();
        daemon
    }

    /// A daemon's folder and command, not started: change its paths, then
    /// [`Daemon::launch`] (or [`Daemon::spawn`]) it.
    pub fn prepare(extra: &[&str]) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("terrace-e2e-")
            .tempdir()
            .expect("temp dir");
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("disks")).expect("disks folder");
        Daemon {
            state_dir: root.join("state"),
            control: root.join("control.sock"),
            nbd_socket: root.join("nbd.sock"),
            log: root.join("daemon.log"),
            root,
            dir,
            child: None,
            tcp: None,
            extra: extra.iter().map(|arg| arg.to_string()).collect(),
            pass_nbd_socket: true,
        }
    }

    /// The `terrace daemon` command this daemon starts with.
    pub fn daemon_command(&self) -> Command {
        let mut command = Command::new(TERRACE);
        command
            .arg("daemon")
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--control")
            .arg(&self.control);
        if self.pass_nbd_socket {
            command.arg("--nbd-socket").arg(&self.nbd_socket);
        }
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(&self.extra)
            .env("RUST_BACKTRACE", "1");
        command
    }

    /// Start the daemon, with more environment variables, and return at
    /// once; see [`Daemon::wait_answering`].
    pub fn spawn(&mut self, env: &[(&str, &std::ffi::OsStr)]) {
        assert!(self.child.is_none(), "the daemon is already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("daemon log");
        let mut command = self.daemon_command();
        command
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", describe(&command)));
        self.child = Some(child);
    }

    /// Start the daemon and wait until it answers `status`.
    pub fn launch(&mut self) {
        self.spawn(&[]);
        self.wait_answering();
    }

    /// Wait until the started daemon answers `status`; note its NBD address.
    pub fn wait_answering(&mut self) {
        let deadline = Instant::now() + DAEMON_TIMEOUT;
        let status = loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!(
                    "the daemon exited ({status}) before answering\n{}",
                    self.log_tail()
                );
            }
            let answer = self.cli(&["--json", "status"]);
            if answer.success() {
                break answer.json();
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not answer `status` within {DAEMON_TIMEOUT:?}\n{}\n{}",
                answer.describe(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            status["pid"].as_u64(),
            Some(u64::from(self.pid())),
            "status answered by another daemon: {status}"
        );
        self.tcp = status["nbd_tcp"].as_str().map(str::to_string);
        assert!(
            self.tcp.is_some(),
            "status reports no NBD TCP address: {status}"
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fail on any line of the daemon's log that reports a problem (see
    /// [`problem_lines`]) and contains none of `allowed`: what a test
    /// expects (a disk it took away, a request it meant to be refused).
    #[track_caller]
    pub fn assert_log_clean(&self, allowed: &[&str]) {
        let problems = problem_lines(&self.log_text(), allowed);
        assert!(
            problems.is_empty(),
            "the daemon's log reports problems:\n{}\n{}",
            problems.join("\n"),
            self.log_tail()
        );
    }

    pub fn log_tail(&self) -> String {
        format!(
            "--- daemon log ({}) ---\n{}",
            self.log.display(),
            tail(&self.log_text(), 80)
        )
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let result = unsafe { libc::kill(self.pid() as i32, signal) };
        assert_eq!(
            result,
            0,
            "kill({signal}) failed: {}",
            std::io::Error::last_os_error()
        );
    }

    fn wait_exit(&mut self, what: &str) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        match child.wait_timeout(DAEMON_TIMEOUT).expect("wait for daemon") {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the daemon did not exit within {DAEMON_TIMEOUT:?} after {what}\n{}",
                    self.log_tail()
                );
            }
        }
    }

    /// SIGKILL: no flush, no clean close.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_exit("SIGKILL");
    }

    /// SIGTERM, and require a clean exit (status 0).
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit("SIGTERM");
        assert!(
            status.success(),
            "the daemon exited with {status} after SIGTERM\n{}",
            self.log_tail()
        );
    }

    /// Start again on the same state folder and sockets.
    pub fn restart(&mut self) {
        self.launch();
    }

    /// The CLI with `--control` pointing at this daemon.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(TERRACE);
        command.arg("--control").arg(&self.control).args(args);
        command
    }

    pub fn cli(&self, args: &[&str]) -> Run {
        run(&mut self.cli_command(args))
    }

    pub fn cli_input(&self, args: &[&str], input: &str) -> Run {
        run_with(
            &mut self.cli_command(args),
            Some(input.as_bytes()),
            COMMAND_TIMEOUT,
        )
    }

    /// Run the CLI and require success.
    #[track_caller]
    pub fn cli_ok(&self, args: &[&str]) -> Run {
        let answer = self.cli(args);
        assert!(
            answer.success(),
            "CLI failed\n{}\n{}",
            answer.describe(),
            self.log_tail()
        );
        answer
    }

    /// Run the CLI with `--json`, require success, parse the answer.
    #[track_caller]
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        self.cli_ok(&all).json()
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.nbd_socket.display())
    }

    pub fn tcp_uri(&self, export: &str) -> String {
        format!(
            "nbd://{}/{export}",
            self.tcp.as_deref().expect("NBD TCP address")
        )
    }

    /// `count` sparse files of `size` bytes, `disks/<prefix>-<i>.img`.
    pub fn disk_files(&self, prefix: &str, count: usize, size: u64) -> Vec<PathBuf> {
        (0..count)
            .map(|i| {
                let path = self.root.join("disks").join(format!("{prefix}-{i}.img"));
                sparse_file(&path, size);
                path
            })
            .collect()
    }

    /// `pool create NAME DISKS... --slab SLAB`; returns the pool view.
    #[track_caller]
    pub fn create_pool(&self, name: &str, disks: &[PathBuf], slab: &str) -> Value {
        self.create_pool_with_usage(name, disks, disks.len(), "auto", slab)
    }

    /// `pool create NAME DISKS --slab SLAB`, the disks from index `first`
    /// on with usage `usage` (hot spares or journal disks after the rest).
    #[track_caller]
    pub fn create_pool_with_usage(
        &self,
        name: &str,
        disks: &[PathBuf],
        first: usize,
        usage: &str,
        slab: &str,
    ) -> Value {
        let specs: Vec<String> = disks
            .iter()
            .enumerate()
            .map(|(index, disk)| {
                if index >= first {
                    format!("{},usage={usage}", disk.display())
                } else {
                    disk.display().to_string()
                }
            })
            .collect();
        let mut args = vec!["pool", "create", name];
        args.extend(specs.iter().map(String::as_str));
        args.extend(["--slab", slab]);
        self.cli_json(&args)
    }

    /// `space create POOL NAME LAYOUT-ARGS --size SIZE`; returns the space view.
    #[track_caller]
    pub fn create_space(&self, pool: &str, name: &str, layout: &[&str], size: &str) -> Value {
        let mut args = vec!["space", "create", pool, name];
        args.extend_from_slice(layout);
        args.extend(["--size", size]);
        let view = self.cli_json(&args);
        assert_eq!(view["name"], name, "space create answered {view}");
        view
    }

    /// A pool `tank` of eight 1 GiB sparse disks with 16 MiB slabs and one
    /// space of every layout, each `size` big. Returns the space views.
    pub fn with_every_layout(size: &str) -> (Daemon, Vec<Value>) {
        let daemon = Daemon::start();
        let disks = daemon.disk_files("tank", 8, GIB);
        daemon.create_pool("tank", &disks, "16M");
        let spaces = LAYOUTS
            .iter()
            .map(|layout| {
                let view = daemon.create_space("tank", layout.name, layout.args, size);
                assert_eq!(view["layout_description"], layout.description, "{view}");
                assert_eq!(view["export"], layout.name, "{view}");
                view
            })
            .collect();
        (daemon, spaces)
    }

    /// `pool status NAME --json`, the one pool's view.
    pub fn pool_status(&self, name: &str) -> Value {
        let answer = self.cli_json(&["pool", "status", name]);
        let pools = answer
            .as_array()
            .unwrap_or_else(|| panic!("pool status is not a list: {answer}"));
        assert_eq!(pools.len(), 1, "pool status {name}: {answer}");
        pools[0].clone()
    }

    pub fn temp(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

/// Words that mark a line of a log or of a client's standard error as a
/// problem report.
const PROBLEM_WORDS: [&str; 7] = [
    "error", "warn", "fail", "panic", "refused", "invalid", "denied",
];

/// The lines of `text` that report a problem and contain none of `allowed`.
pub fn problem_lines(text: &str, allowed: &[&str]) -> Vec<String> {
    text.lines()
        .filter(|line| {
            let lower = line.to_lowercase();
            PROBLEM_WORDS.iter().any(|word| lower.contains(word))
                && !allowed.iter().any(|allowed| line.contains(allowed))
        })
        .map(str::to_string)
        .collect()
}

/// A space presented as a file by nbdfuse; unmounted on drop.
pub struct FuseFile {
    mountpoint: PathBuf,
    pub file: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl FuseFile {
    /// `nbdfuse -P PIDFILE DIR/disk URI`, ready when the pid file is written.
    pub fn attach(parent: &Path, name: &str, uri: &str) -> FuseFile {
        let mountpoint = parent.join(format!("fuse-{name}"));
        std::fs::create_dir_all(&mountpoint).expect("fuse mountpoint");
        let pidfile = parent.join(format!("fuse-{name}.pid"));
        let _ = std::fs::remove_file(&pidfile);
        let log = parent.join(format!("fuse-{name}.log"));
        let output = File::create(&log).expect("nbdfuse log");
        let file = mountpoint.join("disk");
        let mut command = command("nbdfuse");
        command
            .arg("-P")
            .arg(&pidfile)
            .arg(&file)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("log"))
            .stderr(output);
        let text = describe(&command);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {text}: {e}"));
        let mut fuse = FuseFile {
            mountpoint,
            file,
            log,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::fs::read_to_string(&pidfile).is_ok_and(|pid| !pid.trim().is_empty()) {
                break;
            }
            if let Some(status) = fuse
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                fuse.child = None;
                panic!(
                    "{text} exited ({status}) before it was ready:\n{}",
                    fuse.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{text} not ready after 30s:\n{}",
                fuse.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        fuse
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn unmount(&mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // A loop device detached just before lets go of the file a moment
        // later (the kernel releases it asynchronously): retry while busy.
        let deadline = Instant::now() + Duration::from_secs(10);
        let answer = loop {
            let answer = run_with(
                command("fusermount3").arg("-u").arg(&self.mountpoint),
                None,
                Duration::from_secs(60),
            );
            if answer.success() || !answer.stderr.contains("busy") || Instant::now() > deadline {
                break answer;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if !answer.success() {
            let _ = run_with(
                command("umount").arg("-l").arg(&self.mountpoint),
                None,
                Duration::from_secs(60),
            );
        }
        match child.wait_timeout(Duration::from_secs(30)) {
            Ok(Some(_)) => {}
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "nbdfuse did not exit after unmount:\n{}",
                    self.log_text()
                ));
            }
        }
        if answer.success() {
            Ok(())
        } else {
            Err(answer.describe())
        }
    }

    /// Unmount now and require that it went well, and that nbdfuse
    /// reported no error on its standard error meanwhile.
    pub fn detach(self) {
        self.detach_allowing(&[]);
    }

    /// [`FuseFile::detach`], with the errors a test caused on purpose
    /// (lines containing one of `allowed`) let through.
    pub fn detach_allowing(mut self, allowed: &[&str]) {
        if let Err(problem) = self.unmount() {
            panic!("nbdfuse unmount failed: {problem}");
        }
        let problems = problem_lines(&self.log_text(), allowed);
        assert!(
            problems.is_empty(),
            "nbdfuse reported errors:\n{}",
            problems.join("\n")
        );
    }
}

impl Drop for FuseFile {
    fn drop(&mut self) {
        let _ = self.unmount();
    }
}

/// A disk file whose I/O can be made to fail below the file: `nbdkit`
/// serves a sparse image through its error filter and nbdfuse shows it
/// as `file`. While [`FaultyDisk::fail`] holds, every read and write of
/// the file fails with EIO; [`FaultyDisk::heal`] ends that, the data
/// intact (a cable, an enclosure, a controller that came back). nbdfuse
/// is unmounted and nbdkit stopped (by its process id) on drop.
pub struct FaultyDisk {
    fuse: Option<FuseFile>,
    pub file: PathBuf,
    trigger: PathBuf,
    server: Option<Child>,
}

impl FaultyDisk {
    pub fn new(dir: &Path, name: &str, size: u64) -> FaultyDisk {
        FaultyDisk::serve(dir, name, size, "error")
    }

    /// A disk whose reads alone fail while [`FaultyDisk::fail`] holds (an
    /// unreadable surface); writes land.
    pub fn unreadable(dir: &Path, name: &str, size: u64) -> FaultyDisk {
        FaultyDisk::serve(dir, name, size, "error-pread")
    }

    /// `which`: the error filter's parameters to set, `error` (every
    /// operation) or `error-pread` (reads).
    fn serve(dir: &Path, name: &str, size: u64, which: &str) -> FaultyDisk {
        std::fs::create_dir_all(dir).expect("faulty disk folder");
        let image = dir.join(format!("{name}.img"));
        sparse_file(&image, size);
        let socket = dir.join(format!("{name}.sock"));
        let trigger = dir.join(format!("{name}.failing"));
        let log = File::create(dir.join(format!("{name}-nbdkit.log"))).expect("nbdkit log");
        let mut server = command("nbdkit");
        server
            .arg("-f")
            .arg("-U")
            .arg(&socket)
            .arg("--filter=error")
            .arg("file")
            .arg(&image)
            .arg(format!("{which}-rate=100%"))
            .arg(format!("{which}-file={}", trigger.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let text = describe(&server);
        let server = server
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {text}: {e}"));
        let mut disk = FaultyDisk {
            fuse: None,
            file: PathBuf::new(),
            trigger,
            server: Some(server),
        };
        wait_for("nbdkit's socket", Duration::from_secs(30), || {
            socket.exists().then_some(())
        });
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        let fuse = FuseFile::attach(dir, name, &uri);
        disk.file = fuse.file.clone();
        disk.fuse = Some(fuse);
        disk
    }

    /// From now on every I/O of the file fails.
    pub fn fail(&self) {
        File::create(&self.trigger).expect("error trigger");
    }

    /// The file works again, with what it held.
    pub fn heal(&self) {
        std::fs::remove_file(&self.trigger).expect("error trigger");
    }
}

impl Drop for FaultyDisk {
    fn drop(&mut self) {
        drop(self.fuse.take());
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

/// A loop device over a file, with direct I/O; detached on drop.
pub struct LoopDevice {
    pub device: String,
    attached: bool,
}

impl LoopDevice {
    pub fn attach(file: &Path) -> LoopDevice {
        let answer = run_ok(
            command("losetup")
                .args(["--direct-io=on", "-f", "--show"])
                .arg(file),
        );
        let device = answer.stdout.trim().to_string();
        assert!(
            device.starts_with("/dev/loop"),
            "losetup answered {device:?}"
        );
        LoopDevice {
            device,
            attached: true,
        }
    }

    /// Detach now and require that it went well (if not, the drop tries
    /// again).
    pub fn detach(mut self) {
        run_ok(command("losetup").arg("-d").arg(&self.device));
        self.attached = false;
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if self.attached {
            let _ = run(command("losetup").arg("-d").arg(&self.device));
        }
    }
}

/// A mounted filesystem; unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn at(device: &str, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).expect("mount point");
        run_ok(command("mount").arg(device).arg(dir));
        Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    /// Unmounts, retrying for a while if the kernel says the filesystem is
    /// busy: a process started by a test running beside this one can hold
    /// a copy of this test's descriptors for a moment (between its fork
    /// and its exec). If it stays busy, the panic names the holders, and
    /// the drop that follows detaches it lazily.
    pub fn unmount(mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = run(command("umount").arg(&self.dir));
            if answer.success() {
                self.mounted = false;
                return;
            }
            if !answer.stderr.contains("busy") || Instant::now() > deadline {
                panic!(
                    "command failed\n{}\nholders: {:?}",
                    answer.describe(),
                    holders(&self.dir)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Processes with a descriptor, working folder or root under `dir`, as
/// "pid command: path".
fn holders(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return found;
    };
    for process in processes.flatten() {
        let proc_dir = process.path();
        let name = std::fs::read_to_string(proc_dir.join("comm")).unwrap_or_default();
        let mut links: Vec<PathBuf> = vec![proc_dir.join("cwd"), proc_dir.join("root")];
        if let Ok(fds) = std::fs::read_dir(proc_dir.join("fd")) {
            links.extend(fds.flatten().map(|fd| fd.path()));
        }
        for link in links {
            if let Ok(target) = std::fs::read_link(&link) {
                if target.starts_with(dir) {
                    found.push(format!(
                        "{} {}: {}",
                        process.file_name().to_string_lossy(),
                        name.trim(),
                        target.display()
                    ));
                }
            }
        }
    }
    found
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted && !run(command("umount").arg(&self.dir)).success() {
            let _ = run(command("umount").arg("-l").arg(&self.dir));
        }
    }
}

/// Write a tree of `count` files of varied sizes (a few of several MiB) in
/// nested folders under `dir`; returns relative path → SHA-256.
pub fn write_tree(dir: &Path, seed: u64, count: usize) -> BTreeMap<String, String> {
    let mut written = BTreeMap::new();
    for index in 0..count {
        let relative = format!("d{}/e{}/f{index:04}-{seed}.bin", index % 7, (index / 7) % 5);
        let size = match index % 50 {
            0 => 4 * MIB as usize + 123,
            1 => MIB as usize,
            n if n % 10 == 7 => 256 * KIB as usize - 1,
            n => (n * 3301 + index * 17) % (64 * KIB as usize) + 1,
        };
        let data = random_bytes(seed * 100_000 + index as u64, size);
        let path = dir.join(&relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("create folders");
        std::fs::write(&path, &data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        written.insert(relative, sha256_hex(&data));
    }
    written
}

/// Relative path → SHA-256 of every regular file under `dir` (lost+found skipped).
pub fn hash_tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                if entry.file_name() != "lost+found" {
                    walk(root, &path, out);
                }
            } else if kind.is_file() {
                let relative = path
                    .strip_prefix(root)
                    .expect("under root")
                    .display()
                    .to_string();
                out.insert(relative, sha256_file(&path, None));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Fail with a readable list of differences between two trees.
#[track_caller]
pub fn assert_same_tree(
    expected: &BTreeMap<String, String>,
    actual: &BTreeMap<String, String>,
    when: &str,
) {
    if expected == actual {
        return;
    }
    let mut problems = Vec::new();
    for (path, hash) in expected {
        match actual.get(path) {
            None => problems.push(format!("missing {path}")),
            Some(found) if found != hash => problems.push(format!("changed {path}")),
            Some(_) => {}
        }
    }
    for path in actual.keys().filter(|p| !expected.contains_key(*p)) {
        problems.push(format!("unexpected {path}"));
    }
    panic!(
        "{when}: {} differences:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// Disks, extents and data of spaces, for the failure and repair tests.

/// Poll `ready` until it answers `None` (done); `Some(state)` says what
/// it saw, for the failure message.
#[track_caller]
pub fn wait_until(daemon: &Daemon, what: &str, mut ready: impl FnMut() -> Option<String>) {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(90) {
        match ready() {
            None => return,
            Some(state) => last = state,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{what} did not happen: {last}\n{}", daemon.log_tail());
}

/// The disk index of every slot of every extent of a space.
pub fn extent_disks(daemon: &Daemon, name: &str) -> Vec<Vec<usize>> {
    let detail = daemon.cli_json(&["space", "show", name]);
    detail["extent_map"]
        .as_array()
        .expect("extent map")
        .iter()
        .map(|extent| {
            extent["slots"]
                .as_array()
                .expect("slots")
                .iter()
                .map(|slot| slot["disk"].as_u64().expect("disk") as usize)
                .collect()
        })
        .collect()
}

/// Disk indexes holding the space's slabs.
pub fn disks_of(daemon: &Daemon, name: &str) -> Vec<usize> {
    let all: BTreeSet<usize> = extent_disks(daemon, name).into_iter().flatten().collect();
    all.into_iter().collect()
}

/// Delete a disk's backing file and wait until its pool says it is missing.
pub fn delete_and_wait(daemon: &Daemon, pool: &str, files: &[PathBuf], disk: usize) {
    std::fs::remove_file(&files[disk]).expect("remove a disk file");
    wait_until(daemon, "the deleted disk going missing", || {
        let view = daemon.pool_status(pool)["disks"][disk].clone();
        (view["state"] != "MISSING").then(|| view.to_string())
    });
}

/// Read the whole space through NBD and compare its first bytes with `source`.
#[track_caller]
pub fn assert_reads_back(daemon: &Daemon, name: &str, source: &Path, when: &str) {
    let length = std::fs::metadata(source).expect("source").len();
    let copy = daemon.temp().join(format!("{name}.back"));
    run_ok(command("nbdcopy").arg(daemon.uri(name)).arg(&copy));
    assert_eq!(
        sha256_file(&copy, Some(length)),
        sha256_file(source, None),
        "{name}: data {when}"
    );
}

/// Overwrite a whole disk file with zeroes (label, metadata and data), the
/// daemon still holding it open.
pub fn zero_disk(path: &Path) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open a disk file");
    let size = file.metadata().expect("size").len();
    file.set_len(0).expect("truncate");
    file.set_len(size).expect("extend");
}
