//! `terrace generate`: man pages and shell completions made from the CLI's
//! own definition, for `scripts/install` (a hidden command).

use std::path::PathBuf;

use clap::Subcommand;
use clap_complete::Shell;

use crate::CliError;

#[derive(Subcommand)]
pub enum GenerateCommand {
    /// One man page per command into DIR: terrace.1, terrace-pool.1,
    /// terrace-pool-create.1...
    Man { dir: PathBuf },
    /// The completion script of SHELL, on standard output.
    Completions { shell: Shell },
}

/// Write what `command` asks for, describing the CLI `cli`.
pub fn run(command: GenerateCommand, cli: clap::Command) -> Result<(), CliError> {
    match command {
        GenerateCommand::Man { dir } => {
            std::fs::create_dir_all(&dir)?;
            clap_mangen::generate_to(cli, &dir)?;
        }
        GenerateCommand::Completions { shell } => {
            let mut cli = cli;
            let name = cli.get_name().to_string();
            clap_complete::generate(shell, &mut cli, name, &mut std::io::stdout());
        }
    }
    Ok(())
}
