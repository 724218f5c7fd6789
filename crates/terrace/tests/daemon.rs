//! Starting the daemon: its sockets beside its control socket, a live
//! daemon's sockets refused with its PID, a dead one's replaced, nothing
//! left behind by a start that fails, and readiness told to a service
//! manager over `$NOTIFY_SOCKET`.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;

use common::*;

/// A pool `tank` of three sparse disks with a simple space `s` of 64 MiB.
fn pool_with_space(daemon: &Daemon) {
    let disks = daemon.disk_files("tank", 3, GIB);
    daemon.create_pool("tank", &disks, "16M");
    daemon.create_space("tank", "s", &["--layout", "simple"], "64M");
}

/// Write a block to space `s` over the daemon's NBD socket and read it back.
fn serves_over_nbd(daemon: &Daemon, seed: u64) {
    let data = random_bytes(seed, 64 * KIB as usize);
    let mut connection = nbd::Connection::open(&daemon.nbd_socket, "s");
    connection.write(MIB, &data, 0).expect("NBD write");
    connection.flush().expect("NBD flush");
    let read = connection
        .read(MIB, data.len() as u32)
        .expect("NBD read back");
    assert!(read == data, "space s read back other bytes than written");
    connection.disconnect();
}

/// A daemon that will listen on `ctl.sock` in a folder of its own, and is
/// given no NBD socket: it chooses one beside its control socket.
fn daemon_at_its_own_control_socket() -> Daemon {
    let mut daemon = Daemon::prepare(&[]);
    let folder = daemon.root.join("run");
    daemon.control = folder.join("ctl.sock");
    daemon.nbd_socket = folder.join("nbd.sock");
    daemon.pass_nbd_socket = false;
    daemon
}

#[test]
fn daemons_with_control_sockets_in_different_folders_both_serve() {
    let mut first = daemon_at_its_own_control_socket();
    let mut second = daemon_at_its_own_control_socket();
    first.launch();
    second.launch();
    for (seed, daemon) in [&first, &second].into_iter().enumerate() {
        let status = daemon.cli_json(&["status"]);
        assert_eq!(
            status["nbd_socket"],
            daemon.nbd_socket.display().to_string(),
            "the NBD socket is not beside the control socket: {status}"
        );
        pool_with_space(daemon);
        serves_over_nbd(daemon, seed as u64);
    }
    // Each still answers on its own socket, as itself.
    for daemon in [&first, &second] {
        let status = daemon.cli_json(&["status"]);
        assert_eq!(status["pid"].as_u64(), Some(u64::from(daemon.pid())));
    }
}

/// `terrace daemon` for `daemon`'s configuration run to its end: it must
/// fail to start, and its error must name `pid`.
#[track_caller]
fn refused_naming(daemon: &Daemon, pid: u32) -> Run {
    let refused = run(&mut daemon.daemon_command());
    assert!(
        !refused.success(),
        "the daemon started\n{}",
        refused.describe()
    );
    assert!(
        refused.stderr.contains(&format!("PID {pid}")),
        "the refusal does not name PID {pid}\n{}",
        refused.describe()
    );
    refused
}

#[test]
fn a_second_daemon_on_the_same_control_socket_is_refused_naming_the_first() {
    let first = Daemon::start();
    pool_with_space(&first);
    let mut second = Daemon::prepare(&[]);
    second.control = first.control.clone();
    refused_naming(&second, first.pid());

    assert!(
        first.control.exists(),
        "the first daemon's socket was removed"
    );
    let status = first.cli_json(&["status"]);
    assert_eq!(status["pid"].as_u64(), Some(u64::from(first.pid())));
    serves_over_nbd(&first, 1);
}

#[test]
fn a_start_refused_for_the_nbd_socket_leaves_no_control_socket_behind() {
    let first = Daemon::start();
    pool_with_space(&first);
    let mut second = Daemon::prepare(&[]);
    second.nbd_socket = first.nbd_socket.clone();
    refused_naming(&second, first.pid());

    assert!(
        !second.control.exists(),
        "the refused daemon left its control socket {}",
        second.control.display()
    );
    assert!(
        first.nbd_socket.exists(),
        "the first daemon's NBD socket was removed"
    );
    serves_over_nbd(&first, 2);
}

#[test]
fn a_start_that_cannot_listen_for_nbd_leaves_no_socket_behind() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a TCP port");
    let address = taken.local_addr().expect("bound address").to_string();
    let daemon = Daemon::prepare(&[]);
    let failed = run(Command::new(TERRACE)
        .args(["daemon", "--listen", &address])
        .arg("--state-dir")
        .arg(&daemon.state_dir)
        .arg("--control")
        .arg(&daemon.control));
    assert!(
        !failed.success(),
        "the daemon started\n{}",
        failed.describe()
    );
    assert!(
        failed.stderr.contains(&address),
        "the error does not name {address}\n{}",
        failed.describe()
    );
    for socket in [&daemon.control, &daemon.nbd_socket] {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
}

#[test]
fn a_path_that_is_not_a_socket_is_refused_and_left_alone() {
    let daemon = Daemon::prepare(&[]);
    std::fs::write(&daemon.control, "notes").expect("write a file");
    let refused = run(&mut daemon.daemon_command());
    assert!(
        !refused.success(),
        "the daemon started\n{}",
        refused.describe()
    );
    assert!(
        refused.stderr.contains("is not a socket"),
        "{}",
        refused.describe()
    );
    assert_eq!(
        std::fs::read_to_string(&daemon.control).expect("the file is still there"),
        "notes"
    );
}

#[test]
fn the_stale_sockets_of_a_killed_daemon_are_replaced() {
    let mut daemon = Daemon::start();
    pool_with_space(&daemon);
    let first_pid = daemon.pid();
    daemon.kill();
    for socket in [&daemon.control, &daemon.nbd_socket] {
        assert!(socket.exists(), "SIGKILL left no {}", socket.display());
    }
    daemon.restart();
    assert_ne!(daemon.pid(), first_pid);
    serves_over_nbd(&daemon, 3);
}

/// The next datagram the service manager's socket receives.
fn next_notification(manager: &UnixDatagram, what: &str) -> String {
    let mut buffer = [0u8; 4096];
    let length = manager
        .recv(&mut buffer)
        .unwrap_or_else(|error| panic!("no {what} from the daemon: {error}"));
    String::from_utf8_lossy(&buffer[..length]).into_owned()
}

fn bind_manager(path: &Path) -> UnixDatagram {
    let manager = UnixDatagram::bind(path).expect("bind the notification socket");
    manager
        .set_read_timeout(Some(DAEMON_TIMEOUT))
        .expect("read timeout");
    manager
}

#[test]
fn the_daemon_tells_its_service_manager_when_it_serves_and_when_it_stops() {
    let mut daemon = Daemon::start();
    pool_with_space(&daemon);
    daemon.stop();

    let socket = daemon.temp().join("notify.sock");
    let manager = bind_manager(&socket);
    daemon.spawn(&[("NOTIFY_SOCKET", socket.as_os_str())]);
    let ready = next_notification(&manager, "READY=1");
    assert_eq!(ready, "READY=1\n");
    // Ready means serving: the control socket answers at the first try,
    // with the saved pool imported, and its space serves NBD.
    let status = daemon.cli(&["--json", "status"]).check().json();
    assert_eq!(status["pid"].as_u64(), Some(u64::from(daemon.pid())));
    assert_eq!(status["pools"], serde_json::json!(["tank"]), "{status}");
    serves_over_nbd(&daemon, 4);

    daemon.wait_answering();
    daemon.stop();
    assert_eq!(next_notification(&manager, "STOPPING=1"), "STOPPING=1\n");
}
