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
            let mut cli = without_hidden_commands(cli);
            let name = cli.get_name().to_string();
            clap_complete::generate(shell, &mut cli, name, &mut std::io::stdout());
        }
    }
    Ok(())
}

/// `cli` less its hidden commands (`generate`), which the completion
/// generators would offer: clap can add commands but not take one away,
/// so the top level is built again from the rest.
fn without_hidden_commands(cli: clap::Command) -> clap::Command {
    let visible: Vec<clap::Command> = cli
        .get_subcommands()
        .filter(|command| !command.is_hide_set())
        .cloned()
        .collect();
    clap::Command::new(env!("CARGO_BIN_NAME"))
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(cli.is_propagate_version_set())
        .args(cli.get_arguments().cloned())
        .subcommands(visible)
}
