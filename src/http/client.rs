//! `Client` as a handler's argument: the connection's peer and the request's forwarding
//! headers, read as `crate::client` says, against the trusted proxies the service was given.

use crate::app::AppState;
use crate::client::{Client, client_of};
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

impl FromRequestParts<AppState> for Client {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Infallible> {
        // Requests that did not come through the listener (none in the service) have no peer.
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
        Ok(client_of(
            peer,
            &parts.headers,
            &state.settings().listener.trusted_proxies,
        ))
    }
}
