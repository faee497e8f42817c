//! Stamps the binary with the commit it was built from (`TETHER_GIT_SHA`, set by the Makefile
//! and the Dockerfile), or `dev`.

fn main() {
    println!("cargo::rerun-if-env-changed=TETHER_GIT_SHA");
    let sha = std::env::var("TETHER_GIT_SHA").unwrap_or_else(|_| "dev".into());
    println!("cargo::rustc-env=TETHER_BUILD={sha}");
}
