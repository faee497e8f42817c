//! `tether-controller`: parses flags and runs the chosen controller (see lib.rs).

fn main() -> std::process::ExitCode {
    tether_controller::main()
}
