//! Exit codes, so that a script can tell failures apart without reading the message (README,
//! "Exit codes"). A command marks the failures it knows the kind of ([`fail`]); the rest are
//! judged from the error's causes: the API server's status code, a connection that could not be
//! made, a timeout.

use std::fmt;
use std::process::ExitCode;

/// What kind of failure ended a command; its number is the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Any other failure.
    Error = 1,
    /// The command line or the situation needs another flag (clap's own usage errors exit 2 too).
    Usage = 2,
    /// What the command names does not exist (a ClusterSet, a member, a request, the CRDs).
    NotFound = 3,
    /// The API server refused who you are (401) or what you asked (403), or the leader refused
    /// the join token.
    Forbidden = 4,
    /// The cluster (or the leader) could not be reached.
    Unreachable = 5,
    /// What the command waited for did not happen in time.
    Timeout = 6,
    /// Ctrl-C.
    Interrupted = 130,
}

impl Code {
    /// The process exit code.
    pub fn exit(self) -> ExitCode {
        ExitCode::from(self as u8)
    }
}

/// A failure whose kind the command knows; its message is what the user reads.
#[derive(Debug)]
struct Coded {
    code: Code,
    message: String,
}

impl fmt::Display for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Coded {}

/// An error with `code` that says `message`.
pub fn fail(code: Code, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Coded {
        code,
        message: message.into(),
    })
}

/// `return Err(fail(Code::$code, format!(...)))`.
#[macro_export]
macro_rules! bail_code {
    ($code:ident, $($arg:tt)*) => {
        return Err($crate::exit::fail($crate::exit::Code::$code, format!($($arg)*)))
    };
}

/// The exit code of `err`: the code a command gave it, else the kind of its first cause that has
/// one, else [`Code::Error`].
pub fn code_of(err: &anyhow::Error) -> Code {
    if let Some(c) = err.downcast_ref::<Coded>() {
        return c.code;
    }
    err.chain().find_map(kind).unwrap_or(Code::Error)
}

fn kind(cause: &(dyn std::error::Error + 'static)) -> Option<Code> {
    if let Some(c) = cause.downcast_ref::<Coded>() {
        return Some(c.code);
    }
    if let Some(e) = cause.downcast_ref::<kube::Error>() {
        return match e {
            kube::Error::Api(s) => match s.code {
                404 => Some(Code::NotFound),
                401 | 403 => Some(Code::Forbidden),
                504 => Some(Code::Timeout),
                _ => None,
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) => Some(Code::Unreachable),
            _ => None,
        };
    }
    if let Some(tether_join::discovery::DiscoveryError::Unreachable { .. }) = cause.downcast_ref() {
        return Some(Code::Unreachable);
    }
    if let Some(e) = cause.downcast_ref::<std::io::Error>() {
        use std::io::ErrorKind::*;
        return match e.kind() {
            ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected | HostUnreachable
            | NetworkUnreachable | AddrNotAvailable => Some(Code::Unreachable),
            TimedOut => Some(Code::Timeout),
            _ => None,
        };
    }
    if cause.is::<tokio::time::error::Elapsed>() {
        return Some(Code::Timeout);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> anyhow::Error {
        let status = kube::core::Status::failure("x", "y").with_code(code);
        anyhow::Error::new(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn failures_get_the_code_of_their_kind() {
        assert_eq!(code_of(&api(404)), Code::NotFound);
        assert_eq!(code_of(&api(403).context("cannot list")), Code::Forbidden);
        assert_eq!(code_of(&api(401)), Code::Forbidden);
        assert_eq!(code_of(&api(409)), Code::Error);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            code_of(&anyhow::Error::new(refused).context("cannot reach the leader")),
            Code::Unreachable
        );
        assert_eq!(
            code_of(&fail(Code::Timeout, "not Ready after 3m").context("join")),
            Code::Timeout
        );
        // A code the command gave wins over the kind of a cause beneath it.
        assert_eq!(
            code_of(&api(404).context(Coded {
                code: Code::Usage,
                message: "pick one".into()
            })),
            Code::Usage
        );
        let leader = tether_join::discovery::DiscoveryError::Unreachable {
            url: "https://127.0.0.1:1".into(),
            reason: "client error (Connect)".into(),
        };
        assert_eq!(code_of(&anyhow::Error::new(leader)), Code::Unreachable);
        assert_eq!(code_of(&anyhow::anyhow!("something else")), Code::Error);
        assert_eq!(
            fail(Code::NotFound, "no member east").to_string(),
            "no member east"
        );
    }
}
