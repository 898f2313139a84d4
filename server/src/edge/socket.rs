//! Workers' WebSockets: the opening handshake, and a connection whose frames the coordinator
//! writes itself (tungstenite reads them).

mod conn;
mod handshake;

pub use conn::Connection;
pub use handshake::accept;
