//! The `terrace` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod demo;
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
    #[error("space {space}: data read back at offset {offset} differs from what was written")]
    Verify { space: String, offset: u64 },
}

/// terrace: pools of drives, and spaces carved from them with simple,
/// mirror or parity layouts.
#[derive(Parser)]
#[command(name = "terrace", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a demo pool of sparse files, write and verify data on a mirror
    /// and a dual-parity space, lose a disk, verify again, show the status.
    Demo {
        /// Folder for the demo disk files (8 HDD-like, 3 SSD-like, sparse).
        #[arg(long, default_value = "demo-pool")]
        dir: PathBuf,
        /// Data written to each space, e.g. 256M or 1G.
        #[arg(long, default_value = "256M", value_parser = units::parse_size)]
        data: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { dir, data } => futures::executor::block_on(demo::run(demo::DemoOptions {
            directory: dir,
            data_bytes: data,
        })),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("terrace: {error}");
            ExitCode::FAILURE
        }
    }
}
