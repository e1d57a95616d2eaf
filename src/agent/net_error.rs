//! Why the service could not be reached, in words that point at the fix: refused, a name that
//! does not resolve, a TLS handshake that failed, a timeout.
//!
//! reqwest says `error sending request for url (…)` for all of them; the cause is further down
//! its `source()` chain, in an `io::Error` (refused, reset), hyper-util's `dns error`, or a
//! `rustls::Error` that tokio-rustls wraps in an `io::Error`. An `io::Error`'s own `source()`
//! skips the error it wraps, so the walk also looks inside with `get_ref()`.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// What stopped a request from getting an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Nothing listens at that address and port.
    Refused,
    /// The host name does not resolve; `detail` is the resolver's message.
    NameNotResolved { host: String, detail: String },
    /// The TLS handshake failed. `plain_http`: the other side answered, but not in TLS.
    Tls { detail: String, plain_http: bool },
    /// No connection (`connecting`) or no answer within `after`.
    TimedOut { connecting: bool, after: Duration },
    /// The connection was closed or reset before an answer came.
    Closed { detail: String },
    /// Anything else, in the innermost error's words.
    Other(String),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Refused => {
                f.write_str("connection refused (is leasegate running and listening there?)")
            }
            Cause::NameNotResolved { host, detail } => write!(
                f,
                "the name {host} could not be resolved ({detail}); check the server URL and this machine's DNS"
            ),
            Cause::Tls {
                detail,
                plain_http: true,
            } => write!(
                f,
                "TLS handshake failed: {detail} (the server does not speak TLS there: plain HTTP? then use an http:// URL)"
            ),
            Cause::Tls { detail, .. } => write!(
                f,
                "TLS handshake failed: {detail} (a certificate this machine does not trust, or one for another name?)"
            ),
            Cause::TimedOut {
                connecting: true,
                after,
            } => write!(
                f,
                "no connection within {} s (timed out: a firewall dropping packets, or the wrong address?)",
                after.as_secs_f64()
            ),
            Cause::TimedOut { after, .. } => {
                write!(f, "no answer within {} s (timed out)", after.as_secs_f64())
            }
            Cause::Closed { detail } => {
                write!(
                    f,
                    "the connection was closed before an answer came ({detail})"
                )
            }
            Cause::Other(detail) => f.write_str(detail),
        }
    }
}

/// The timeouts a client was built with, for the sentence about a timeout.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub request: Duration,
}

/// Why `e`, from a request to `url`, got no answer.
pub fn cause(e: &reqwest::Error, url: &reqwest::Url, timeouts: Timeouts) -> Cause {
    let chain = chain(e);
    let io_kind = |kinds: &[std::io::ErrorKind]| {
        chain.iter().any(|err| {
            err.downcast_ref::<std::io::Error>()
                .is_some_and(|io| kinds.contains(&io.kind()))
        })
    };
    let innermost = chain
        .last()
        .map(|err| err.to_string())
        .unwrap_or_else(|| e.to_string());

    if io_kind(&[std::io::ErrorKind::ConnectionRefused]) {
        return Cause::Refused;
    }
    if e.is_timeout() || io_kind(&[std::io::ErrorKind::TimedOut]) {
        return Cause::TimedOut {
            connecting: e.is_connect(),
            after: if e.is_connect() {
                timeouts.connect
            } else {
                timeouts.request
            },
        };
    }
    if let Some(tls) = chain
        .iter()
        .find_map(|err| err.downcast_ref::<rustls::Error>())
    {
        return Cause::Tls {
            detail: tls.to_string(),
            plain_http: is_not_tls(tls),
        };
    }
    if chain.iter().any(|err| is_dns_error(&err.to_string())) {
        return Cause::NameNotResolved {
            host: url.host_str().unwrap_or_default().to_string(),
            detail: innermost,
        };
    }
    let eof = io_kind(&[std::io::ErrorKind::UnexpectedEof]);
    if url.scheme() == "https" && e.is_connect() {
        // The other side closed during the handshake: most often a plain-HTTP server that
        // gave up on a ClientHello it could not read.
        return Cause::Tls {
            detail: innermost,
            plain_http: eof,
        };
    }
    if eof
        || io_kind(&[
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::ConnectionAborted,
            std::io::ErrorKind::BrokenPipe,
        ])
        || chain.iter().any(|err| {
            err.to_string()
                .contains("connection closed before message completed")
        })
    {
        return Cause::Closed { detail: innermost };
    }
    Cause::Other(innermost)
}

/// `e` and its sources, with the error inside each `io::Error`.
fn chain<'a>(e: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        out.push(err);
        // The wrapped error comes next, in place of the wrapper's source (which is the wrapped
        // error's source): it may be an `io::Error` itself, as tokio-rustls's is.
        next = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn Error + 'static)),
            None => err.source(),
        };
    }
    out
}

/// The resolver's failure as hyper-util and getaddrinfo word it (`dns error`, then glibc's or
/// musl's message; hickory's `no record found` should reqwest be built with it).
fn is_dns_error(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "dns error",
        "failed to lookup address",
        "name or service not known",
        "nodename nor servname",
        "no address associated",
        "temporary failure in name resolution",
        "no record found",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// A handshake answered with something that is not TLS (an HTTP response to a ClientHello).
fn is_not_tls(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType
                | rustls::InvalidMessage::UnknownProtocolVersion
                | rustls::InvalidMessage::MessageTooLarge
        ) | rustls::Error::InappropriateMessage { .. }
    )
}

#[cfg(test)]
mod tests {
    //! Each cause against something real on this machine: a closed port, a name in `.invalid`
    //! (RFC 6761: never resolves), TLS to a plain-HTTP listener, a listener that never
    //! answers and one that hangs up. Nothing listens beyond 127.0.0.1.
    use super::*;
    use crate::agent::client::{AgentClient, ClientError};

    const QUICK: Timeouts = Timeouts {
        connect: Duration::from_secs(5),
        request: Duration::from_millis(500),
    };

    async fn unreachable(server: &str) -> (Cause, String) {
        let client = AgentClient::with_timeouts(server, QUICK).unwrap();
        let e = client.heartbeat("a.b.c").await.unwrap_err();
        match &e {
            ClientError::Unreachable { cause, source, .. } => {
                (cause.clone(), format!("{e}\n  chain: {:?}", chain(source)))
            }
            other => panic!("not unreachable: {other:?}"),
        }
    }

    fn closed_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn a_closed_port_is_refused() {
        let server = format!("http://127.0.0.1:{}", closed_port());
        let (cause, text) = unreachable(&server).await;
        assert_eq!(cause, Cause::Refused, "{text}");
        assert!(
            text.starts_with(&format!(
                "cannot reach {server}: connection refused (is leasegate running and listening there?)\n"
            )),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_named() {
        let (cause, text) = unreachable("http://nonexistent.invalid:8080").await;
        let Cause::NameNotResolved { host, detail } = &cause else {
            panic!("{text}");
        };
        assert_eq!(host, "nonexistent.invalid");
        assert!(!detail.is_empty());
        assert!(
            text.starts_with(
                "cannot reach http://nonexistent.invalid:8080: the name nonexistent.invalid could not be resolved ("
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn https_to_a_plain_http_listener_is_a_tls_mismatch() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "plain" }));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let (cause, text) = unreachable(&format!("https://{addr}")).await;
        server.abort();
        assert!(
            matches!(
                cause,
                Cause::Tls {
                    plain_http: true,
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("TLS handshake failed: "), "{text}");
        assert!(text.contains("use an http:// URL"), "{text}");
    }

    #[tokio::test]
    async fn a_listener_that_never_answers_times_out_and_one_that_hangs_up_is_closed() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = silent.accept().await {
                held.push(conn);
            }
        });
        let (cause, text) = unreachable(&format!("http://{addr}")).await;
        hold.abort();
        assert_eq!(
            cause,
            Cause::TimedOut {
                connecting: false,
                after: QUICK.request
            },
            "{text}"
        );
        assert!(
            text.contains("no answer within 0.5 s (timed out)"),
            "{text}"
        );

        let rude = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = rude.local_addr().unwrap();
        let hang_up = tokio::spawn(async move {
            while let Ok((conn, _)) = rude.accept().await {
                drop(conn);
            }
        });
        let (cause, text) = unreachable(&format!("http://{addr}")).await;
        hang_up.abort();
        assert!(matches!(cause, Cause::Closed { .. }), "{text}");
    }
}
