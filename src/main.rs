//! `leaseagent`: wiring only. Argument parsing is in `cmd`, each subcommand in
//! its own module, the run itself in `agent`.

use std::process::ExitCode;

use leaseagent::cmd::{self, Command};

fn main() -> ExitCode {
    match cmd::parse(std::env::args_os().collect()) {
        Command::Run(cfg) => leaseagent::agent::main(cfg),
        Command::Serve(a) => leaseagent::serve::main(a),
        Command::Publish(a) => leaseagent::cmd::publish::main(a),
        Command::Check(a) => leaseagent::cmd::check::main(a),
        Command::Leases(a) => leaseagent::cmd::operator::leases(a),
        Command::Revoke(a) => leaseagent::cmd::operator::revoke(a),
        Command::Clear(a) => leaseagent::cmd::operator::clear(a),
        Command::Keeper(args) => leaseagent::keeper::main(args),
        Command::Exit(code) => ExitCode::from(code),
    }
}
