//! The server's settings: where it listens, who may call it, and every limit.

use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

/// Everything bounded, with the defaults `hetsched serve` starts with.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Request body bytes at most (413 beyond).
    pub max_body_bytes: usize,
    /// Bytes of a request's head (request line and headers) at most; hyper's read buffer,
    /// at least 8192 (the connection is closed with 431 beyond).
    pub max_header_bytes: usize,
    /// Prompt tokens at most, after the chat template (400 beyond; the model's context
    /// bounds it too).
    pub max_prompt_tokens: usize,
    /// `max_tokens` at most (400 beyond).
    pub max_tokens: usize,
    /// New tokens when a request gives no `max_tokens` (cut to what the context leaves).
    pub default_max_tokens: usize,
    /// `n` at most (400 beyond).
    pub max_n: usize,
    /// Stop strings at most, and bytes per stop string.
    pub max_stop: usize,
    /// Bytes per stop string at most.
    pub max_stop_bytes: usize,
    /// Open connections at most (more wait in the listen backlog).
    pub max_connections: usize,
    /// Requests held by the engine (queued and running) at most (503 beyond).
    pub max_requests: usize,
    /// Time a client has to send a request's head (headers), and the longest an idle
    /// keep-alive connection is kept.
    pub header_timeout: Duration,
    /// Time a client has to send a request's body (408 beyond).
    pub body_timeout: Duration,
    /// Longest a write to a client may wait (a client that stops reading is dropped and
    /// its request cancelled).
    pub write_timeout: Duration,
    /// After SIGTERM or SIGINT: time in-flight requests have to finish before they are
    /// cancelled.
    pub shutdown_grace: Duration,
    /// Seconds a 503 asks the client to wait (`Retry-After`).
    pub retry_after_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 1 << 20,
            max_header_bytes: 16 << 10,
            max_prompt_tokens: 4096,
            max_tokens: 2048,
            default_max_tokens: 256,
            max_n: 8,
            max_stop: 4,
            max_stop_bytes: 256,
            max_connections: 64,
            max_requests: 32,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            retry_after_seconds: 1,
        }
    }
}

/// The server's settings.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Whether a non-loopback address may be used (then `api_key` is required).
    pub allow_remote: bool,
    /// Bearer token every `/v1/*` and `/metrics` request must carry, if set.
    pub api_key: Option<String>,
    /// The model's name in `/v1/models` and in responses; requests naming another model
    /// get 404.
    pub model_id: String,
    /// The limits.
    pub limits: Limits,
}

/// A setting that cannot work.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A non-loopback address without the explicit flag.
    #[error(
        "{addr} is not a loopback address: serving other hosts needs --allow-remote (and \
         --api-key); use 127.0.0.1 to serve this machine only"
    )]
    RemoteNotAllowed {
        /// The address.
        addr: SocketAddr,
    },
    /// A non-loopback address without an API key.
    #[error("serving other hosts ({addr}) needs --api-key: a bearer token clients must send")]
    RemoteWithoutKey {
        /// The address.
        addr: SocketAddr,
    },
    /// An empty API key.
    #[error("the API key is empty: give a non-empty token")]
    EmptyKey,
    /// A limit of zero, or a header limit below hyper's minimum.
    #[error("limit {name} = {value} is out of range: {why}")]
    Limit {
        /// Which limit.
        name: &'static str,
        /// Its value.
        value: u64,
        /// What is allowed.
        why: &'static str,
    },
}

impl ServeConfig {
    /// Refuses settings that cannot work or would expose the server unprotected.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.api_key.as_deref() == Some("") {
            return Err(ConfigError::EmptyKey);
        }
        if !self.addr.ip().is_loopback() {
            if !self.allow_remote {
                return Err(ConfigError::RemoteNotAllowed { addr: self.addr });
            }
            if self.api_key.is_none() {
                return Err(ConfigError::RemoteWithoutKey { addr: self.addr });
            }
        }
        let l = &self.limits;
        let counts = [
            ("max_body_bytes", l.max_body_bytes),
            ("max_prompt_tokens", l.max_prompt_tokens),
            ("max_tokens", l.max_tokens),
            ("default_max_tokens", l.default_max_tokens),
            ("max_n", l.max_n),
            ("max_connections", l.max_connections),
            ("max_requests", l.max_requests),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(ConfigError::Limit {
                    name,
                    value: 0,
                    why: "give at least 1",
                });
            }
        }
        if l.max_header_bytes < 8192 {
            return Err(ConfigError::Limit {
                name: "max_header_bytes",
                value: l.max_header_bytes as u64,
                why: "at least 8192 (the HTTP parser's smallest buffer)",
            });
        }
        let times = [
            ("header_timeout", l.header_timeout),
            ("body_timeout", l.body_timeout),
            ("write_timeout", l.write_timeout),
        ];
        for (name, value) in times {
            if value.is_zero() {
                return Err(ConfigError::Limit {
                    name,
                    value: 0,
                    why: "give a time above 0",
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(addr: &str) -> ServeConfig {
        ServeConfig {
            addr: addr.parse().unwrap(),
            allow_remote: false,
            api_key: None,
            model_id: "m".into(),
            limits: Limits::default(),
        }
    }

    #[test]
    fn another_host_needs_the_flag_and_a_key() {
        assert_eq!(config("127.0.0.1:8080").validate(), Ok(()));
        assert_eq!(config("[::1]:8080").validate(), Ok(()));
        let mut remote = config("0.0.0.0:8080");
        assert!(matches!(
            remote.validate(),
            Err(ConfigError::RemoteNotAllowed { .. })
        ));
        remote.allow_remote = true;
        assert!(matches!(
            remote.validate(),
            Err(ConfigError::RemoteWithoutKey { .. })
        ));
        remote.api_key = Some(String::new());
        assert_eq!(remote.validate(), Err(ConfigError::EmptyKey));
        remote.api_key = Some("k".into());
        assert_eq!(remote.validate(), Ok(()));
    }

    #[test]
    fn zero_limits_are_refused_by_name() {
        let mut c = config("127.0.0.1:1");
        c.limits.max_n = 0;
        assert!(c.validate().unwrap_err().to_string().contains("max_n"));
        let mut c = config("127.0.0.1:1");
        c.limits.max_header_bytes = 100;
        assert!(c.validate().unwrap_err().to_string().contains("8192"));
    }
}
