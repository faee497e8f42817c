//! `tether-testrun`: `make test`'s job graph (the library says how).

fn main() -> std::process::ExitCode {
    tether_testrun::run()
}
