//! `web_sys::WebSocket` as an async source of events and a sink of binary frames.
//!
//! The socket's JS callbacks are `Closure`s owned by [`Socket`] and detached in `Drop`, so
//! every reconnect frees the previous connection's closures (no `Closure::forget` leak).

use std::cell::RefCell;
use std::rc::Rc;

use futures_channel::{mpsc, oneshot};
use futures_util::StreamExt;
use js_sys::{ArrayBuffer, Uint8Array};
use wasm_bindgen::prelude::*;
use web_sys::{BinaryType, CloseEvent, Event, MessageEvent, WebSocket};

#[derive(Debug)]
pub enum SocketEvent {
    Frame(Vec<u8>),
    Closed { code: u16, reason: String },
}

pub struct Socket {
    ws: WebSocket,
    events: mpsc::UnboundedReceiver<SocketEvent>,
    _on_open: Closure<dyn FnMut(Event)>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
    _on_close: Closure<dyn FnMut(CloseEvent)>,
    _on_error: Closure<dyn FnMut(Event)>,
}

type OpenSignal = Rc<RefCell<Option<oneshot::Sender<Result<(), String>>>>>;

impl Socket {
    /// Opens a connection and waits until it is open (or failed).
    pub async fn connect(url: &str) -> Result<Socket, String> {
        let ws = WebSocket::new(url).map_err(|e| format!("{e:?}"))?;
        ws.set_binary_type(BinaryType::Arraybuffer);
        let (tx, events) = mpsc::unbounded();
        let (open_tx, open_rx) = oneshot::channel();
        let open: OpenSignal = Rc::new(RefCell::new(Some(open_tx)));

        let on_open = {
            let open = open.clone();
            Closure::<dyn FnMut(Event)>::new(move |_| {
                if let Some(tx) = open.borrow_mut().take() {
                    let _ = tx.send(Ok(()));
                }
            })
        };
        let on_message = {
            let tx = tx.clone();
            Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
                if let Ok(buf) = e.data().dyn_into::<ArrayBuffer>() {
                    let _ = tx.unbounded_send(SocketEvent::Frame(Uint8Array::new(&buf).to_vec()));
                }
            })
        };
        let on_close = {
            let open = open.clone();
            Closure::<dyn FnMut(CloseEvent)>::new(move |e: CloseEvent| {
                if let Some(pending) = open.borrow_mut().take() {
                    let _ = pending.send(Err(format!("connection refused (code {})", e.code())));
                }
                let _ = tx.unbounded_send(SocketEvent::Closed {
                    code: e.code(),
                    reason: e.reason(),
                });
            })
        };
        // An error is always followed by a close event, which carries the details.
        let on_error = Closure::<dyn FnMut(Event)>::new(|_| {});
        ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        ws.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        // Built before waiting, so a failed connect still detaches its callbacks in Drop.
        let socket = Socket {
            ws,
            events,
            _on_open: on_open,
            _on_message: on_message,
            _on_close: on_close,
            _on_error: on_error,
        };
        match open_rx.await {
            Ok(Ok(())) => Ok(socket),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("connection abandoned".into()),
        }
    }

    pub fn send(&self, frame: &[u8]) -> Result<(), String> {
        self.ws
            .send_with_u8_array(frame)
            .map_err(|e| format!("send failed: {e:?}"))
    }

    /// The next event; `None` never happens while the socket lives (close is an event).
    pub async fn next(&mut self) -> Option<SocketEvent> {
        self.events.next().await
    }

    /// An event that has already arrived, if any (between two inner steps).
    pub fn try_next(&mut self) -> Option<SocketEvent> {
        self.events.try_recv().ok()
    }

    /// A handle to close the socket from elsewhere (e.g. `stop()`).
    pub fn handle(&self) -> WebSocket {
        self.ws.clone()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.ws.set_onopen(None);
        self.ws.set_onmessage(None);
        self.ws.set_onclose(None);
        self.ws.set_onerror(None);
        let _ = self.ws.close();
    }
}
