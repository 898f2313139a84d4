//! A worker's WebSocket, read through tungstenite and written by hand.
//!
//! tungstenite formats every frame it sends into a write buffer of its own, so the weights,
//! encoded once per version as shared `Bytes`, were copied again into every connection's
//! buffer: a 64 KiB copy per chunk and per worker, and one chunk's worth of buffer held by
//! every connection (65 MB over 1,000 workers). Here the coordinator's frames go to the socket
//! as a 2-10 byte header and the shared payload itself, in one vectored write, with nothing
//! copied and nothing buffered beyond the frame being written.
//!
//! Reading stays tungstenite's (frame parsing, unmasking, size limits, control frames). What
//! tungstenite itself wants to send (a pong, the echo of a close) lands in a small queue, and
//! goes out between two frames: never inside one, which would corrupt the stream.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// What the socket is: any byte stream (TCP, TLS) once upgraded.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Bytes tungstenite asked to write (pongs, a close echo), whole frames, in order.
type ControlQueue = Arc<Mutex<Vec<u8>>>;

/// One worker's WebSocket: a `Stream` of the messages it sends and a `Sink` of ours.
pub struct Connection<T: Io> {
    reader: WebSocketStream<ReadSide<T>>,
    writer: WriteHalf<T>,
    control: ControlQueue,
    /// Control bytes taken from the queue, being written, and how far.
    control_out: Vec<u8>,
    control_written: usize,
    /// The frame being written.
    frame: Option<Outgoing>,
}

impl<T: Io> std::fmt::Debug for Connection<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("writing", &self.frame.is_some())
            .finish_non_exhaustive()
    }
}

impl<T: Io> Connection<T> {
    /// A server-side WebSocket over an upgraded connection (the handshake is done).
    pub async fn new(io: T, config: WebSocketConfig) -> Self {
        let (read, writer) = tokio::io::split(io);
        let control = ControlQueue::default();
        let side = ReadSide {
            read,
            control: Arc::clone(&control),
        };
        let reader = WebSocketStream::from_raw_socket(side, Role::Server, Some(config)).await;
        Self {
            reader,
            writer,
            control,
            control_out: Vec::new(),
            control_written: 0,
            frame: None,
        }
    }

    /// Writes what is under way: first the frame begun, then whatever control bytes
    /// tungstenite queued meanwhile. Ready when nothing is left.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(frame) = &mut self.frame {
            while !frame.done() {
                let (header, payload) = frame.rest();
                let slices = [IoSlice::new(header), IoSlice::new(payload)];
                let n = ready!(Pin::new(&mut self.writer).poll_write_vectored(cx, &slices))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                frame.written += n;
            }
            self.frame = None;
        }
        loop {
            if self.control_written == self.control_out.len() {
                self.control_out.clear();
                self.control_written = 0;
                let mut queued = self.control.lock().expect("not poisoned");
                if queued.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                std::mem::swap(&mut self.control_out, &mut *queued);
            }
            let rest = &self.control_out[self.control_written..];
            let n = ready!(Pin::new(&mut self.writer).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.control_written += n;
        }
    }
}

impl<T: Io> Stream for Connection<T> {
    type Item = Result<Message, WsError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = Pin::new(&mut self.reader).poll_next(cx);
        // A pong tungstenite queued while reading goes out now, unless a frame is under way
        // (its end takes the pong along). A write error shows on the next read or write.
        let control_due = self.control_written < self.control_out.len()
            || !self.control.lock().expect("not poisoned").is_empty();
        if self.frame.is_none() && control_due {
            if let Poll::Ready(Ok(())) = self.poll_write_out(cx) {
                let _ = Pin::new(&mut self.writer).poll_flush(cx);
            }
        }
        item
    }
}

impl<T: Io> Sink<Message> for Connection<T> {
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_write_out(cx)
    }

    fn start_send(mut self: Pin<&mut Self>, msg: Message) -> io::Result<()> {
        debug_assert!(self.frame.is_none(), "poll_ready first");
        self.frame = Some(Outgoing::new(msg));
        Ok(())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_out(cx))?;
        Pin::new(&mut self.writer).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}

/// One frame on its way out: its header, and its payload as given (not copied).
struct Outgoing {
    header: [u8; 10],
    header_len: usize,
    payload: Bytes,
    /// Bytes of header and payload written so far.
    written: usize,
}

const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

impl Outgoing {
    fn new(msg: Message) -> Self {
        let (opcode, payload) = match msg {
            Message::Binary(b) => (OP_BINARY, b),
            Message::Text(t) => (OP_TEXT, Bytes::from(t)),
            Message::Ping(b) => (OP_PING, b),
            Message::Pong(b) => (OP_PONG, b),
            Message::Close(frame) => {
                let mut body = Vec::new();
                if let Some(frame) = frame {
                    body.extend_from_slice(&u16::from(frame.code).to_be_bytes());
                    body.extend_from_slice(frame.reason.as_bytes());
                }
                (OP_CLOSE, Bytes::from(body))
            }
            Message::Frame(frame) => {
                let opcode = u8::from(frame.header().opcode);
                (opcode, frame.into_payload())
            }
        };
        let (header, header_len) = header(opcode, payload.len());
        Self {
            header,
            header_len,
            payload,
            written: 0,
        }
    }

    fn done(&self) -> bool {
        self.written == self.header_len + self.payload.len()
    }

    /// What is left of the header, and of the payload.
    fn rest(&self) -> (&[u8], &[u8]) {
        let in_header = self.written.min(self.header_len);
        let in_payload = self.written - in_header;
        (
            &self.header[in_header..self.header_len],
            &self.payload[in_payload..],
        )
    }
}

/// The header of a final, unmasked frame (a server's, RFC 6455 §5.2) and its length.
fn header(opcode: u8, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = 0x80 | opcode;
    let n = if len < 126 {
        h[1] = len as u8;
        2
    } else if let Ok(len) = u16::try_from(len) {
        h[1] = 126;
        h[2..4].copy_from_slice(&len.to_be_bytes());
        4
    } else {
        h[1] = 127;
        h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    };
    (h, n)
}

/// What tungstenite reads from and writes to: the socket's read half, and the control queue.
struct ReadSide<T: Io> {
    read: ReadHalf<T>,
    control: ControlQueue,
}

impl<T: Io> AsyncRead for ReadSide<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl<T: Io> AsyncWrite for ReadSide<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.control
            .lock()
            .expect("not poisoned")
            .extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;

    /// Frames of every size class written by hand read back, through tungstenite as a client
    /// reads them, exactly; a client's ping is answered with a pong between two frames.
    #[tokio::test]
    async fn hand_written_frames_read_back_exactly() {
        let (server_io, client_io) = tokio::io::duplex(4096);
        let mut server = Connection::new(server_io, WebSocketConfig::default()).await;
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        let sizes = [0usize, 1, 125, 126, 65_535, 65_536, 200_000];
        let payloads: Vec<Bytes> = sizes
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|i| (i * 7 % 251) as u8)
                    .collect::<Vec<u8>>()
                    .into()
            })
            .collect();
        let writer = async {
            for p in &payloads {
                server.feed(Message::Binary(p.clone())).await.unwrap();
            }
            server.flush().await.unwrap();
            server
        };
        let reader = async {
            let mut got = Vec::new();
            while got.len() < payloads.len() {
                match client.next().await {
                    Some(Ok(Message::Binary(b))) => got.push(b),
                    other => panic!("{other:?}"),
                }
            }
            got
        };
        let (mut server, got) = tokio::join!(writer, reader);
        assert_eq!(got, payloads);

        // The client pings; the server's tungstenite queues a pong, written with the next frame.
        client
            .send(Message::Ping(Bytes::from_static(b"hi")))
            .await
            .unwrap();
        let Some(Ok(Message::Ping(_))) = server.next().await else {
            panic!("ping expected");
        };
        // The next read hands tungstenite's pong to the queue, and it goes out then.
        assert!(futures_util::FutureExt::now_or_never(server.next()).is_none());
        server
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Policy,
                reason: "bye".into(),
            })))
            .await
            .unwrap();
        let mut seen = Vec::new();
        while let Some(Ok(msg)) = client.next().await {
            let end = matches!(msg, Message::Close(_));
            seen.push(msg);
            if end {
                break;
            }
        }
        assert!(
            matches!(&seen[0], Message::Pong(b) if &b[..] == b"hi"),
            "{seen:?}"
        );
        let Message::Close(Some(frame)) = &seen[1] else {
            panic!("{seen:?}")
        };
        assert_eq!(
            (frame.code, frame.reason.as_str()),
            (CloseCode::Policy, "bye")
        );
    }

    #[test]
    fn headers_use_the_shortest_length_form() {
        assert_eq!(header(OP_BINARY, 125).0[..2], [0x82, 125]);
        assert_eq!(header(OP_BINARY, 126).0[..4], [0x82, 126, 0, 126]);
        assert_eq!(header(OP_PING, 0).0[..2], [0x89, 0]);
        let (h, n) = header(OP_BINARY, 65_536);
        assert_eq!((n, &h[..n]), (10, &[0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0][..]));
    }
}
