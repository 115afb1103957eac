//! `leaseagent`: wiring only. Argument parsing is in `cli`, each subcommand in
//! its own module, the run itself in `run`.

use std::process::ExitCode;

use leaseagent::cli::{self, Command};

fn main() -> ExitCode {
    match cli::parse(std::env::args_os().collect()) {
        Command::Run(cfg) => leaseagent::run::main(cfg),
        Command::Serve(a) => leaseagent::serve::main(a),
        Command::Publish(a) => leaseagent::publish::main(a),
        Command::Check(a) => leaseagent::check::main(a),
        Command::Leases(a) => leaseagent::opcmd::leases(a),
        Command::Revoke(a) => leaseagent::opcmd::revoke(a),
        Command::Clear(a) => leaseagent::opcmd::clear(a),
        Command::TokenNew => leaseagent::serve::auth::token_new(),
        Command::Keeper(args) => leaseagent::keeper::main(args),
        Command::Exit(code) => ExitCode::from(code),
    }
}
