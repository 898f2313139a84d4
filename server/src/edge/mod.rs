//! The network edge: everything that faces a client. The HTTP routes ([`routes`]) and who may
//! open a WebSocket ([`admission`]); the WebSocket itself ([`socket`]) and one task per worker
//! that moves its bytes ([`session`]), within the limits ([`rate`], [`upload`] slots); TLS
//! ([`tls`]); and the views: the page ([`assets`]), the admin API ([`admin`]), Server-Sent
//! Events ([`events`]), `/metrics` ([`exposition`]), the weights ([`params`]); what
//! the routes share is [`state`]. No training decision is taken here.

pub mod admin;
pub mod admission;
pub mod assets;
pub mod events;
pub mod exposition;
pub mod params;
pub mod rate;
pub mod routes;
pub mod session;
pub mod socket;
pub mod state;
pub mod tls;
pub mod upload;
