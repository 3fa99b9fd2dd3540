//! Starting a connection, the path every slot's socket takes: URL, DNS
//! (off the loop, answered by token), the address guard, TCP, TLS, then a
//! websocket handshake or one HTTP GET, all under one deadline.
//!
//! The guard runs on the resolved address, not the name, so a public name
//! that resolves to a private address is refused like the address itself;
//! the own and bootstrap relays (`trusted`) skip it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use mio::{Interest, Token};
use rustls::pki_types::ServerName;

use crate::sans_io::identity::address::{host_and_port, ip_literal, refusal_reason};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::info_fetch;
use crate::shell::connect_error::ConnectError;
use crate::shell::dns::{Pending, Resolved};
use crate::shell::slots::{Conn, Resolving, SlotKind};
use crate::shell::ws::{HttpGet, TlsTarget, WsConnection};
use crate::shell::{Shell, ShellTimer};

/// Time a connection (DNS, TCP, TLS, websocket) may take.
const CONNECT_DEADLINE: Duration = Duration::from_secs(30);

/// What a slot's connection speaks once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    /// A websocket (relay or own-relay sink).
    Ws,
    /// One HTTP GET (a NIP-11 fetch).
    Http,
}

impl Shell {
    /// Allocates a slot and starts resolving or connecting `url`.
    pub(super) fn start_conn(
        &mut self,
        url: &str,
        transport: Transport,
        trusted: bool,
        now: Time,
        kind: impl FnOnce(Conn) -> SlotKind,
    ) -> Result<Token, ConnectError> {
        let (host, port) = host_and_port(url).ok_or(ConnectError::UnparsableUrl)?;
        let tls = if url.starts_with("wss://") {
            let name = ServerName::try_from(host.clone()).map_err(ConnectError::TlsName)?;
            Some(TlsTarget {
                config: self.tls.clone(),
                name,
            })
        } else {
            None
        };
        let conn = match ip_literal(&host) {
            Some(ip) => self.connect_ip(url, transport, ip, port, tls, trusted)?,
            None => Conn::Resolving(Box::new(Resolving {
                url: url.to_owned(),
                port,
                tls,
                trusted,
                lookup: Pending::none(),
            })),
        };
        let resolving = matches!(conn, Conn::Resolving(_));
        let token = self.slots.insert(kind(conn), self.poll.registry())?;
        if resolving {
            match self.resolver.resolve(token.0 as u64, &host, port) {
                Ok(pending) => self.hold_lookup(token, pending),
                Err(e) => {
                    self.slots.remove(token);
                    self.stats.dns_failures += 1;
                    return Err(ConnectError::DnsQueue(e));
                }
            }
        }
        let deadline = match transport {
            Transport::Ws => CONNECT_DEADLINE,
            Transport::Http => info_fetch::DEADLINE,
        };
        self.timers.insert(
            (now + deadline).as_millis(),
            ShellTimer::ConnectDeadline(token),
        );
        Ok(token)
    }

    /// Starts connecting `ip` for `url` if the address guard allows it
    /// (`trusted`: the own and bootstrap relays skip it).
    fn connect_ip(
        &mut self,
        url: &str,
        transport: Transport,
        ip: IpAddr,
        port: u16,
        tls: Option<TlsTarget>,
        trusted: bool,
    ) -> Result<Conn, ConnectError> {
        if !trusted
            && !self.opts.allow_private_addresses
            && let Some(reason) = refusal_reason(ip)
        {
            self.stats.address_refused += 1;
            return Err(ConnectError::Refused { reason, ip });
        }
        let addr = SocketAddr::new(ip, port);
        match transport {
            Transport::Ws => WsConnection::connect(addr, url, tls, self.ws_config)
                .map(|ws| Conn::Ws(Box::new(ws))),
            Transport::Http => {
                let request = info_fetch::request(url).ok_or(ConnectError::NoHttpRequest)?;
                HttpGet::connect(addr, request, tls).map(|get| Conn::Http(Box::new(get)))
            }
        }
        .map_err(ConnectError::Connect)
    }

    /// Keeps `pending` in the slot it resolves for, so dropping the slot
    /// (deadline, disconnect, shutdown) cancels a lookup still queued.
    fn hold_lookup(&mut self, token: Token, pending: Pending) {
        if let Some(Conn::Resolving(resolving)) =
            self.slots.get_mut(token).and_then(|s| s.kind.conn_mut())
        {
            resolving.lookup = pending;
        }
    }

    pub(super) fn on_resolved(&mut self, resolved: Resolved, now: Time) {
        let token = Token(resolved.id as usize);
        let Some(slot) = self.slots.get_mut(token) else {
            return;
        };
        let transport = match slot.kind {
            SlotKind::Info { .. } => Transport::Http,
            _ => Transport::Ws,
        };
        let Some(conn) = slot.kind.conn_mut() else {
            return;
        };
        let Conn::Resolving(resolving) = conn else {
            return;
        };
        let url = std::mem::take(&mut resolving.url);
        let (port, tls, trusted) = (resolving.port, resolving.tls.take(), resolving.trusted);
        resolving.lookup = Pending::none();
        let addrs = match resolved.result {
            Ok(a) if !a.is_empty() => a,
            Ok(_) | Err(_) => {
                self.stats.dns_failures += 1;
                return self.fail_slot(token, "DNS lookup failed", now);
            }
        };
        let allowed = trusted || self.opts.allow_private_addresses;
        let Some(addr) = addrs
            .iter()
            .find(|a| allowed || refusal_reason(a.ip()).is_none())
        else {
            self.stats.address_refused += 1;
            return self.fail_slot(
                token,
                "resolves only to private addresses (see --allow-private-addresses)",
                now,
            );
        };
        match self.connect_ip(&url, transport, addr.ip(), port, tls, true) {
            Ok(mut connected) => {
                let registered = connected.socket().map(|s| {
                    self.poll
                        .registry()
                        .register(s, token, Interest::READABLE | Interest::WRITABLE)
                });
                if let Some(Err(e)) = registered {
                    return self.fail_slot(token, &ConnectError::Register(e).to_string(), now);
                }
                if let Some(conn) = self.slots.get_mut(token).and_then(|s| s.kind.conn_mut()) {
                    *conn = connected;
                }
            }
            Err(reason) => self.fail_slot(token, &reason.to_string(), now),
        }
    }
}
