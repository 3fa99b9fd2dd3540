//! The relay farm's connections: listening (again, after a restart),
//! accepting, setting handshakes up, restarting a relay and closing.

use super::super::limits::STRFRY_NEG_FRAME_LIMIT;
use super::strfry::StrfryConn;
use super::*;

impl Farm {
    /// Listens again (after a restart) and accepts what is pending.
    pub(super) fn listen(&mut self, relay: usize, generation: u32) {
        let Some(r) = self.relays.get_mut(relay) else {
            return;
        };
        if r.generation != generation {
            return;
        }
        if !matches!(r.listen, Listen::Open(_)) {
            let bound = match std::mem::replace(&mut r.listen, Listen::Closed) {
                Listen::Reserved(reserved) => port::listen(reserved),
                _ => TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, r.port))),
            }
            .and_then(|mut listener| {
                self.poll
                    .registry()
                    .register(
                        &mut listener,
                        listener_token(relay, generation),
                        Interest::READABLE,
                    )
                    .map(|()| listener)
            });
            match bound {
                Ok(listener) => r.listen = Listen::Open(listener),
                Err(e) => {
                    log::warn!("relay farm: relay {relay} cannot listen again: {e}");
                    self.schedule(Instant::now() + RETRY, Timer::Listen { relay, generation });
                    return;
                }
            }
        }
        self.accept(relay, generation);
    }

    /// Accepts every pending connection of a relay.
    pub(super) fn accept(&mut self, relay: usize, generation: u32) {
        loop {
            let Some(r) = self.relays.get(relay) else {
                return;
            };
            if r.generation != generation {
                return;
            }
            let Listen::Open(listener) = &r.listen else {
                return;
            };
            match listener.accept() {
                Ok((socket, _)) => self.add_conn(relay, socket),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => {
                    // E.g. out of file descriptors: the pending connections
                    // stay queued; try again shortly.
                    log::warn!("relay farm: relay {relay} accept failed: {e}");
                    self.schedule(Instant::now() + RETRY, Timer::Listen { relay, generation });
                    return;
                }
            }
        }
    }

    /// Registers an accepted connection and starts its handshake.
    pub(super) fn add_conn(&mut self, relay: usize, mut tcp: TcpStream) {
        let own = Arc::new(AtomicBool::new(false));
        let own_client = self.own_client(&own);
        let ws_config = self.ws_config_for(relay);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if key >= INDEX_LIMIT {
            log::warn!("relay farm: too many connections, dropping one");
            return;
        }
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1) & GEN_MASK;
        // Nagle would delay small replies, unless the relay emulates one
        // that leaves it on; failing to disable it is harmless.
        if !self.relays[relay].profile.nagle {
            let _ = tcp.set_nodelay(true);
        }
        let token = conn_token(key, generation);
        if let Err(e) =
            self.poll
                .registry()
                .register(&mut tcp, token, Interest::READABLE | Interest::WRITABLE)
        {
            log::warn!("relay farm: cannot register a connection: {e}");
            return;
        }
        let socket = Socket {
            tcp,
            counters: Arc::clone(&self.counters),
            delay: self.relays[relay].link.delay(Instant::now()),
        };
        let stream = match &self.tls {
            None => MaybeTls::Plain(socket),
            Some(config) => match ServerConnection::new(Arc::clone(config)) {
                Ok(tls) => MaybeTls::Tls(Box::new(StreamOwned::new(tls, socket))),
                Err(e) => {
                    log::warn!("relay farm: TLS setup failed: {e}");
                    let mut socket = socket;
                    let _ = self.poll.registry().deregister(&mut socket.tcp);
                    return;
                }
            },
        };
        let profile = &self.relays[relay].profile;
        let phase = if profile.serves_http() && self.tls.is_none() {
            Phase::Sniffing(stream)
        } else {
            match Farm::start_handshake(stream, ws_config, own_client) {
                Some(phase) => phase,
                None => return,
            }
        };
        let strfry = profile.strfry.map(StrfryConn::new);
        let negs = match profile.strfry {
            Some(limits) => NegSessions::new(limits.max_subscriptions, STRFRY_NEG_FRAME_LIMIT),
            None => NegSessions::default(),
        };
        let challenge = self.relays[relay].auth.then(|| challenge(&mut self.rng));
        let mut conn = Conn {
            relay,
            generation,
            own,
            phase,
            subs: HashMap::new(),
            negs,
            strfry,
            challenge: challenge.clone(),
            authed: false,
            out: VecDeque::new(),
            queued: 0,
            blocked: false,
            mute: false,
        };
        if let Some(challenge) = challenge {
            // Sent as soon as the websocket is open: the first thing queued.
            conn.queue(&RelayMessage::auth(challenge));
        }
        entry.insert(conn);
        self.relays[relay].conns.push(key);
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        self.schedule(
            Instant::now() + HANDSHAKE_TIMEOUT,
            Timer::Handshake { key, generation },
        );
        self.drive(key);
    }

    /// What recognizes a client of [`RelayFarm::own_url`] at its handshake.
    pub(super) fn own_client(&self, own: &Arc<AtomicBool>) -> OwnClient {
        OwnClient {
            token: Arc::clone(&self.token),
            own: Arc::clone(own),
            counters: Arc::clone(&self.counters),
        }
    }

    /// Sets a websocket handshake up (nothing is read yet), or fails.
    pub(super) fn start_handshake(
        stream: Stream,
        config: WebSocketConfig,
        own: OwnClient,
    ) -> Option<Phase> {
        match tungstenite::accept_hdr_with_config(stream, own, Some(config)) {
            Ok(ws) => Some(Phase::Open(ws)),
            Err(HandshakeError::Interrupted(mid)) => Some(Phase::Handshaking(mid)),
            Err(HandshakeError::Failure(e)) => {
                log::debug!("relay farm: handshake failed: {e}");
                None
            }
        }
    }

    /// Cuts a relay's connections, closes its listener and schedules
    /// listening again.
    pub(super) fn restart(&mut self, relay: usize, down_for: Duration) {
        let Some(r) = self.relays.get_mut(relay) else {
            return;
        };
        r.generation = r.generation.wrapping_add(1) & GEN_MASK;
        let generation = r.generation;
        r.listen = match std::mem::replace(&mut r.listen, Listen::Closed) {
            Listen::Open(mut listener) => {
                let _ = self.poll.registry().deregister(&mut listener);
                drop(listener);
                // Without it, listening again is retried until the port is free.
                port::reserve(r.port)
                    .map(Listen::Reserved)
                    .unwrap_or_else(|e| {
                        log::warn!("relay farm: relay {relay} cannot keep its port: {e}");
                        Listen::Closed
                    })
            }
            down => down,
        };
        for key in std::mem::take(&mut r.conns) {
            self.close(key);
        }
        self.schedule(
            Instant::now() + down_for,
            Timer::Listen { relay, generation },
        );
    }

    /// Drops a connection: TCP shutdown, no close frame.
    pub(super) fn close(&mut self, key: usize) {
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        if let Some(r) = self.relays.get_mut(conn.relay)
            && let Some(pos) = r.conns.iter().position(|&k| k == key)
        {
            r.conns.swap_remove(pos);
        }
        if let Some(stream) = conn.stream() {
            let tcp = &mut stream.transport_mut().tcp;
            let _ = self.poll.registry().deregister(tcp);
            // Already closed by the peer is fine: the goal is a closed socket.
            let _ = tcp.shutdown(Shutdown::Both);
        }
        self.counters.connections.fetch_sub(1, Ordering::Relaxed);
        if conn.own.load(Ordering::Relaxed) {
            self.counters
                .own_connections
                .fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Cuts every connection (on stop).
    pub(super) fn close_all(&mut self) {
        let keys: Vec<usize> = self.conns.iter().map(|(key, _)| key).collect();
        for key in keys {
            self.close(key);
        }
    }
}
