//! A lean HTTP/1.1 client for the bench's phases of small requests (attestations, forge
//! fetches, `/readyz`): one kept-alive connection per worker, each request written in one
//! piece, only the status line and the body's length read back.
//!
//! Why not the general client: on this machine kind the load generator shares the service's
//! two cores, and a general-purpose client (connection pool, header maps, body streams) costs
//! about as much CPU per request as the service does, which the ratios would then count
//! against the service. A real fleet's runners send from their own machines.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

/// Connections to one server, one slot per worker (a worker only ever uses its own).
pub struct Wire {
    addr: SocketAddr,
    host: String,
    slots: Vec<Mutex<Option<Conn>>>,
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Wire {
    /// For `base` (`http://host:port`), with `workers` slots.
    pub async fn new(base: &str, workers: usize) -> anyhow::Result<Wire> {
        let host = base
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("the bench's lean client speaks plain http: {base}"))?
            .trim_end_matches('/')
            .to_string();
        let addr = tokio::net::lookup_host(&host)
            .await?
            .next()
            .ok_or_else(|| anyhow::anyhow!("{host} resolves to no address"))?;
        Ok(Wire {
            addr,
            host,
            slots: (0..workers.max(1)).map(|_| Mutex::new(None)).collect(),
        })
    }

    /// POSTs the JSON `body` to `path` on `worker`'s connection and answers the status code.
    pub async fn post_json(&self, worker: usize, path: &str, body: &str) -> std::io::Result<u16> {
        self.send(
            worker,
            "POST",
            path,
            "content-type: application/json\r\n",
            body,
        )
        .await
    }

    /// Sends `method` `path` with the header lines `headers` (each ending in CRLF) and `body`
    /// on `worker`'s connection, and answers the status code. A connection that fails or that
    /// the server closes is opened anew on the next call.
    pub async fn send(
        &self,
        worker: usize,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> std::io::Result<u16> {
        let mut slot = self.slots[worker % self.slots.len()].lock().await;
        if slot.is_none() {
            let stream = TcpStream::connect(self.addr).await?;
            stream.set_nodelay(true)?;
            *slot = Some(Conn {
                stream,
                buf: Vec::with_capacity(4096),
            });
        }
        let conn = slot.as_mut().expect("connected above");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\n{headers}content-length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        match conn.exchange(request.as_bytes()).await {
            Ok((status, keep)) => {
                if !keep {
                    *slot = None;
                }
                Ok(status)
            }
            Err(e) => {
                *slot = None;
                Err(e)
            }
        }
    }
}

impl Conn {
    /// Writes `request`, reads one response; answers its status and whether the connection
    /// stays open.
    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<(u16, bool)> {
        self.stream.write_all(request).await?;
        self.buf.clear();
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.read_more().await?;
        };
        let head = Head::parse(&self.buf[..head_end])?;
        if head.chunked {
            while !self.buf[head_end..].ends_with(b"0\r\n\r\n") {
                self.read_more().await?;
            }
        } else {
            while self.buf.len() < head_end + head.content_length {
                self.read_more().await?;
            }
        }
        Ok((head.status, !head.close))
    }

    async fn read_more(&mut self) -> std::io::Result<()> {
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }
}

/// What the bench needs of a response's head.
#[derive(Debug, PartialEq)]
struct Head {
    status: u16,
    content_length: usize,
    chunked: bool,
    close: bool,
}

impl Head {
    fn parse(head: &[u8]) -> std::io::Result<Head> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let text =
            std::str::from_utf8(head).map_err(|_| bad("a response head that is not UTF-8"))?;
        let mut lines = text.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("a response without a status line"))?;
        let mut parsed = Head {
            status,
            content_length: 0,
            chunked: false,
            close: false,
        };
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                parsed.content_length = value.parse().map_err(|_| bad("a bad content-length"))?;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                parsed.chunked = value.eq_ignore_ascii_case("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                parsed.close = value.eq_ignore_ascii_case("close");
            }
        }
        Ok(parsed)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_gives_its_status_length_and_connection() {
        let head = Head::parse(
            b"HTTP/1.1 409 Conflict\r\nContent-Type: application/problem+json\r\nContent-Length: 212\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            head,
            Head {
                status: 409,
                content_length: 212,
                chunked: false,
                close: false
            }
        );
        let head = Head::parse(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        )
        .unwrap();
        assert!(head.chunked && head.close && head.status == 200);
    }

    #[test]
    fn a_garbled_head_is_an_error() {
        assert!(Head::parse(b"nonsense\r\n\r\n").is_err());
        assert!(Head::parse(b"HTTP/1.1 200 OK\r\ncontent-length: lots\r\n\r\n").is_err());
    }
}
