//! The `terrace` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod api;
mod bench;
mod cli;
mod daemon;
mod demo;
mod generate;
mod paths;
mod progress;
mod render;
mod units;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Engine(#[from] terrace_engine::EngineError),
    #[error("{0}")]
    Io(#[from] terrace_engine::io::IoError),
    #[error("{0}")]
    File(#[from] std::io::Error),
    #[error("{0}")]
    Size(#[from] units::SizeError),
    #[error("{0}")]
    Nbd(#[from] terrace_export::client::NbdError),
    #[error("cannot reach the daemon at {socket}: {error}; start it with `terrace daemon` (or point --control at its socket)")]
    NoDaemon {
        socket: String,
        error: std::io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Refused(String),
    #[error("unexpected answer from the daemon: {0}")]
    Protocol(String),
    #[error("{0}")]
    Daemon(String),
    #[error("{0}")]
    Bench(terrace_bench::BenchError),
    #[error("space {space}: data read back at offset {offset} differs from what was written")]
    Verify { space: String, offset: u64 },
}

impl CliError {
    /// 2 for usage errors, 1 for everything else.
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Size(_) => 2,
            _ => 1,
        }
    }
}

/// terrace: pools of drives, and spaces carved from them with simple,
/// mirror or parity layouts, served over NBD.
#[derive(Parser)]
#[command(name = "terrace", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// The daemon's control socket [env: TERRACE_CONTROL].
    #[arg(long, global = true)]
    control: Option<PathBuf>,
    /// Print the answer as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Own the pools and serve their spaces over NBD (TCP and a Unix socket).
    Daemon {
        /// Folder for the list of pools to import at start [env: TERRACE_STATE_DIR].
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// NBD TCP address.
        #[arg(long, default_value = "127.0.0.1:10809")]
        listen: SocketAddr,
        /// Serve NBD on no TCP address at all.
        #[arg(long, conflicts_with = "listen")]
        no_tcp: bool,
        /// NBD Unix socket (default: nbd.sock beside the control socket).
        #[arg(long)]
        nbd_socket: Option<PathBuf>,
        /// Threads serving each NBD socket connection, each carrying one
        /// request at a time; 0 serves connections with async tasks.
        #[arg(long, default_value_t = daemon::NBD_THREADS_DEFAULT)]
        nbd_threads: usize,
        /// Bytes of log records the write-back logs keep in memory, shared
        /// equally by the open pools, e.g. 4G (default: a quarter of the
        /// machine's memory). Logged data beyond it is read back from the
        /// log's disks when read or destaged.
        #[arg(long, value_parser = units::parse_size)]
        log_memory: Option<u64>,
    },
    /// Demo pool of sparse files: serve a mirror and a dual-parity space over
    /// NBD, write and verify through the protocol, lose a disk, verify again.
    Demo {
        /// Folder for the demo disk files and sockets.
        #[arg(long, default_value = "demo-pool")]
        dir: PathBuf,
        /// Data written to each space, e.g. 256M or 1G.
        #[arg(long, default_value = "256M", value_parser = units::parse_size)]
        data: u64,
        /// NBD TCP address while the demo serves.
        #[arg(long, default_value = "127.0.0.1:10809")]
        listen: SocketAddr,
        /// Stop after the checks instead of serving until Ctrl-C.
        #[arg(long)]
        exit: bool,
    },
    /// The daemon: version, sockets, NBD address, pools.
    Status,
    /// Ask the daemon to shut down cleanly (as SIGTERM does).
    Shutdown,
    /// Pools: create, list, status, import, export, destroy.
    #[command(subcommand)]
    Pool(cli::PoolCommand),
    /// Disks: list candidates, add to a pool, set usage.
    #[command(subcommand)]
    Disk(cli::DiskCommand),
    /// Spaces: create, list, show, resize, delete.
    #[command(subcommand)]
    Space(cli::SpaceCommand),
    /// Jobs: list, wait (with progress), pause, resume, cancel.
    #[command(subcommand)]
    Job(cli::JobCommand),
    /// Measure the white paper's load profiles (file-copy, file-server,
    /// database, streaming, restore) over outstanding I/Os against NBD
    /// exports, files, devices or spaces; `bench paper` reproduces the paper.
    Bench(Box<bench::BenchArgs>),
    /// Man pages and shell completions, for installing (scripts/install).
    #[command(subcommand, hide = true)]
    Generate(generate::GenerateCommand),
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn run(cli: Cli) -> Result<(), CliError> {
    let control = cli.control.unwrap_or_else(paths::control_socket);
    let request = match cli.command {
        Command::Daemon {
            state_dir,
            listen,
            no_tcp,
            nbd_socket,
            nbd_threads,
            log_memory,
        } => {
            let nbd_socket = nbd_socket.unwrap_or_else(|| paths::nbd_socket_beside(&control));
            let config = daemon::DaemonConfig {
                state_dir: state_dir.unwrap_or_else(paths::state_dir),
                control_socket: control,
                nbd_tcp: (!no_tcp).then_some(listen),
                nbd_socket: Some(nbd_socket),
                nbd_threads,
                log_memory,
            };
            daemon::keep_freed_buffers();
            return daemon::runtime_builder()
                .build()?
                .block_on(daemon::run(config))
                .map_err(CliError::Daemon);
        }
        Command::Demo {
            dir,
            data,
            listen,
            exit,
        } => {
            let options = demo::DemoOptions {
                directory: dir,
                data_bytes: data,
                listen,
                serve_until_interrupted: !exit,
            };
            return runtime()?.block_on(demo::run(options));
        }
        Command::Bench(args) => return bench::run(*args, &control, cli.json),
        Command::Generate(command) => return generate::run(command, Cli::command()),
        Command::Status => api::Request::DaemonStatus,
        Command::Shutdown => api::Request::Shutdown,
        Command::Pool(command) => cli::pool_request(command)?,
        Command::Disk(command) => cli::disk_request(command)?,
        Command::Space(command) => cli::space_request(command, &control)?,
        Command::Job(cli::JobCommand::Wait { id, pool }) => {
            let job = runtime()?.block_on(cli::wait_for_job(&control, id, pool))?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&job).unwrap_or_default());
            }
            return match job.state.as_str() {
                "done" => Ok(()),
                _ => Err(CliError::Refused(format!(
                    "job {id} ended {}: {}",
                    job.state,
                    job.reason.as_deref().unwrap_or("no reason given")
                ))),
            };
        }
        Command::Job(command) => cli::job_request(&command),
    };
    let result = runtime()?.block_on(cli::call_showing_preparation(&control, &request))?;
    let failed = cli::failure_in(&request, &result);
    if cli.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        );
    } else {
        print!("{}", cli::render(&request, result.clone())?);
    }
    failed.map_or(Ok(()), |why| Err(CliError::Refused(why)))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Daemon { .. } | Command::Demo { .. } | Command::Bench(_)
    ) {
        // A command's output piped into `head` or `grep -q` ends quietly
        // when the reader goes, as other tools do, rather than panicking
        // in `print!`. The servers keep SIGPIPE ignored: a client that
        // hangs up is an error on its socket, not the end of the daemon.
        // SAFETY: restoring a signal's default disposition, before any
        // thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("terrace: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
