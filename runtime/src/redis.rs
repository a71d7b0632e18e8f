//! The few Redis commands argocd-pull sends to an Argo CD's Redis: the
//! hub's tree writer (`AUTH`, `SET` with an expiry, `DEL`, `PUBLISH`) and
//! the agent's tree reporter (`GET`, and `PSUBSCRIBE` on a connection of
//! its own), over one connection opened on first use and again after any
//! error: RESP written and read by hand, since nothing else of a Redis
//! client is needed.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

/// How long one command (with connecting) may take (the error says 10 s).
const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest bulk reply read unless [`Redis::with_max_reply`] says
/// otherwise (the writer's replies are a few bytes).
const MAX_REPLY: usize = 1 << 20;
/// The most elements of an array reply read (a subscription's messages
/// have three or four).
const MAX_ARRAY: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("redis at {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("redis at {addr} answered: {message}")]
    Refused { addr: String, message: String },
    #[error("redis at {addr}: no answer within 10 s")]
    Timeout { addr: String },
    #[error("redis at {addr}: a reply this client does not read ({what})")]
    Protocol { addr: String, what: String },
}

/// A reply, as far as this client reads one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// One connection to one Redis, used by one command at a time.
pub struct Redis {
    addr: String,
    password: Option<String>,
    max_reply: usize,
    conn: Mutex<Option<BufReader<TcpStream>>>,
}

impl Redis {
    /// `addr` is `host:port`; `password` is sent with `AUTH` on every new
    /// connection (Argo CD's Redis has one, from the `argocd-redis` Secret).
    pub fn new(addr: impl Into<String>, password: Option<String>) -> Self {
        Self {
            addr: addr.into(),
            password,
            max_reply: MAX_REPLY,
            conn: Mutex::new(None),
        }
    }

    /// [`Redis::new`] with the password read from `password_file` (Argo
    /// CD's `argocd-redis` Secret's `auth` key, mounted), when one is named;
    /// the error is `<path>: <why>`, for the caller to prefix with its flag.
    pub fn with_password_file(
        addr: impl Into<String>,
        password_file: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let password = match password_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
            None => None,
        };
        Ok(Self::new(addr, password))
    }

    /// Reads bulk replies up to `bytes` (a longer one is an error that
    /// names its length).
    pub fn with_max_reply(mut self, bytes: usize) -> Self {
        self.max_reply = bytes;
        self
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `SET key value PX ttl`.
    pub async fn set(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), Error> {
        let ms = ttl.as_millis().max(1).to_string();
        self.command(&[b"SET", key.as_bytes(), value, b"PX", ms.as_bytes()])
            .await
            .map(drop)
    }

    /// `DEL key`: whether there was such a key.
    pub async fn del(&self, key: &str) -> Result<bool, Error> {
        match self.command(&[b"DEL", key.as_bytes()]).await? {
            Reply::Integer(n) => Ok(n > 0),
            other => Err(self.protocol(format!("DEL answered {other:?}"))),
        }
    }

    /// `PUBLISH channel message`.
    pub async fn publish(&self, channel: &str, message: &[u8]) -> Result<(), Error> {
        self.command(&[b"PUBLISH", channel.as_bytes(), message])
            .await
            .map(drop)
    }

    /// `GET key` (for tests and checks).
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        match self.command(&[b"GET", key.as_bytes()]).await? {
            Reply::Bulk(v) => Ok(v),
            other => Err(self.protocol(format!("GET answered {other:?}"))),
        }
    }

    /// `PSUBSCRIBE pattern` on a connection of its own, which then only
    /// receives: read the messages with [`Subscription::next`].
    pub async fn psubscribe(&self, pattern: &str) -> Result<Subscription, Error> {
        let mut conn = tokio::time::timeout(TIMEOUT, self.connect())
            .await
            .map_err(|_| self.timeout())??;
        let confirm = tokio::time::timeout(
            TIMEOUT,
            self.round_trip(&mut conn, &[b"PSUBSCRIBE", pattern.as_bytes()]),
        )
        .await
        .map_err(|_| self.timeout())??;
        match confirm {
            Reply::Array(items)
                if items.first() == Some(&Reply::Bulk(Some(b"psubscribe".to_vec()))) =>
            {
                let reader = Reader {
                    redis: Redis {
                        addr: self.addr.clone(),
                        password: None,
                        max_reply: self.max_reply,
                        conn: Mutex::new(None),
                    },
                    conn,
                };
                let (tx, messages) = tokio::sync::mpsc::channel(1024);
                let task = tokio::spawn(reader.run(tx));
                Ok(Subscription {
                    messages,
                    _reader: crate::task::AbortOnDrop(task),
                    addr: self.addr.clone(),
                })
            }
            other => Err(self.protocol(format!("PSUBSCRIBE answered {other:?}"))),
        }
    }

    /// One command; a connection that failed is dropped and opened again
    /// by the next command.
    pub async fn command(&self, args: &[&[u8]]) -> Result<Reply, Error> {
        let mut conn = self.conn.lock().await;
        let result = tokio::time::timeout(TIMEOUT, async {
            if conn.is_none() {
                *conn = Some(self.connect().await?);
            }
            let stream = conn.as_mut().expect("connected above");
            self.round_trip(stream, args).await
        })
        .await
        .unwrap_or_else(|_| Err(self.timeout()));
        if matches!(
            result,
            Err(Error::Io { .. } | Error::Timeout { .. } | Error::Protocol { .. })
        ) {
            *conn = None;
        }
        result
    }

    async fn connect(&self) -> Result<BufReader<TcpStream>, Error> {
        let stream = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| self.io(e))?;
        stream.set_nodelay(true).map_err(|e| self.io(e))?;
        let mut stream = BufReader::new(stream);
        if let Some(password) = &self.password {
            self.round_trip(&mut stream, &[b"AUTH", password.as_bytes()])
                .await?;
        }
        Ok(stream)
    }

    async fn round_trip(
        &self,
        stream: &mut BufReader<TcpStream>,
        args: &[&[u8]],
    ) -> Result<Reply, Error> {
        stream
            .get_mut()
            .write_all(&encode(args))
            .await
            .map_err(|e| self.io(e))?;
        self.read_reply(stream).await
    }

    async fn read_reply(&self, stream: &mut BufReader<TcpStream>) -> Result<Reply, Error> {
        match self.read_item(stream).await? {
            Item::Reply(reply) => Ok(reply),
            Item::Array(len) => {
                let mut items = Vec::with_capacity(len);
                for _ in 0..len {
                    match self.read_item(stream).await? {
                        Item::Reply(reply) => items.push(reply),
                        Item::Array(_) => {
                            return Err(self.protocol("an array inside an array".into()));
                        }
                    }
                }
                Ok(Reply::Array(items))
            }
        }
    }

    /// One reply, or the length of an array whose elements follow.
    async fn read_item(&self, stream: &mut BufReader<TcpStream>) -> Result<Item, Error> {
        let mut line = Vec::new();
        stream
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| self.io(e))?;
        let Some(text) = line.strip_suffix(b"\r\n") else {
            return Err(self.protocol("the connection ended mid-reply".into()));
        };
        let (kind, rest) = text
            .split_first()
            .ok_or_else(|| self.protocol("an empty line".into()))?;
        let rest = String::from_utf8_lossy(rest).into_owned();
        let length = |what: &str| {
            rest.parse::<i64>()
                .map_err(|_| self.protocol(format!("{what} length {rest:?}")))
        };
        match *kind {
            b'+' => Ok(Item::Reply(Reply::Simple(rest))),
            b'-' => Err(Error::Refused {
                addr: self.addr.clone(),
                message: rest,
            }),
            b':' => rest
                .parse()
                .map(|n| Item::Reply(Reply::Integer(n)))
                .map_err(|_| self.protocol(format!("integer {rest:?}"))),
            b'*' => {
                let len = length("array")?;
                if len < 0 {
                    return Ok(Item::Reply(Reply::Bulk(None)));
                }
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > MAX_ARRAY {
                    return Err(self.protocol(format!("an array of {len} elements")));
                }
                Ok(Item::Array(len))
            }
            b'$' => {
                let len = length("bulk")?;
                if len < 0 {
                    return Ok(Item::Reply(Reply::Bulk(None)));
                }
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > self.max_reply {
                    return Err(self.protocol(format!(
                        "a bulk reply of {len} bytes (at most {} are read)",
                        self.max_reply
                    )));
                }
                let mut body = vec![0; len + 2];
                stream.read_exact(&mut body).await.map_err(|e| self.io(e))?;
                body.truncate(len);
                Ok(Item::Reply(Reply::Bulk(Some(body))))
            }
            other => Err(self.protocol(format!("type byte {:?}", other as char))),
        }
    }

    fn timeout(&self) -> Error {
        Error::Timeout {
            addr: self.addr.clone(),
        }
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    fn protocol(&self, what: String) -> Error {
        Error::Protocol {
            addr: self.addr.clone(),
            what,
        }
    }
}

/// What one RESP line opens.
enum Item {
    Reply(Reply),
    Array(usize),
}

/// A connection in subscriber mode, from [`Redis::psubscribe`]. A task of
/// its own reads the connection (a read dropped halfway would lose the
/// stream's framing), so [`Subscription::next`] is cancel-safe and may sit
/// in a `select!`; dropping the subscription ends the task.
pub struct Subscription {
    messages: tokio::sync::mpsc::Receiver<Result<(String, Vec<u8>), Error>>,
    _reader: crate::task::AbortOnDrop<()>,
    addr: String,
}

impl Subscription {
    /// The next message published on a channel the pattern matches:
    /// `(channel, message)`. Waits as long as nothing is published; an
    /// error ends the subscription (subscribe again). Cancel-safe.
    pub async fn next(&mut self) -> Result<(String, Vec<u8>), Error> {
        self.messages.recv().await.unwrap_or_else(|| {
            Err(Error::Protocol {
                addr: self.addr.clone(),
                what: "the subscription ended".into(),
            })
        })
    }
}

/// Reads a subscribed connection to the end of each message.
struct Reader {
    /// How replies are read and errors named (never connects).
    redis: Redis,
    conn: BufReader<TcpStream>,
}

impl Reader {
    /// Sends each message, then the error that ends the connection.
    async fn run(mut self, tx: tokio::sync::mpsc::Sender<Result<(String, Vec<u8>), Error>>) {
        loop {
            let next = self.next().await;
            let failed = next.is_err();
            if tx.send(next).await.is_err() || failed {
                return;
            }
        }
    }

    async fn next(&mut self) -> Result<(String, Vec<u8>), Error> {
        loop {
            match self.redis.read_reply(&mut self.conn).await? {
                Reply::Array(items) => match &items[..] {
                    [
                        Reply::Bulk(Some(kind)),
                        _,
                        Reply::Bulk(Some(channel)),
                        Reply::Bulk(Some(message)),
                    ] if kind == b"pmessage" => {
                        return Ok((
                            String::from_utf8_lossy(channel).into_owned(),
                            message.clone(),
                        ));
                    }
                    // Confirmations of other (un)subscriptions.
                    _ => continue,
                },
                other => {
                    return Err(self
                        .redis
                        .protocol(format!("a subscriber received {other:?}")));
                }
            }
        }
    }
}

/// A command as RESP: an array of bulk strings.
fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_an_array_of_bulk_strings() {
        assert_eq!(
            encode(&[b"SET", b"a|b", b"\x00\r\n", b"PX", b"1000"]),
            b"*5\r\n$3\r\nSET\r\n$3\r\na|b\r\n$3\r\n\x00\r\n\r\n$2\r\nPX\r\n$4\r\n1000\r\n"
        );
        assert_eq!(encode(&[b"DEL", b""]), b"*2\r\n$3\r\nDEL\r\n$0\r\n\r\n");
    }
}
