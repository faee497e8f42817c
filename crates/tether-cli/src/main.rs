//! `tether` (or `kubectl tether`): parses the command line and runs it (see lib.rs).

fn main() -> std::process::ExitCode {
    tether_cli::main()
}
