//! Pre-login places (of the PostgreSQL port, and of the web console's HTTP connections until a request of a
//! logged-in session arrives on one): from its TCP accept until its login completes, a connection holds one of `max_pending_logins`
//! places (never a connection slot), and a client address at most `max_pending_logins_per_address` of them. An
//! address is counted as a group ([`address_group`]): an IPv6 client by its /64 prefix, which one host usually holds
//! whole (counted address by address, one host would have any number of shares).
//!
//! **A newcomer is never turned away for want of a place.** When every place is taken, it takes the place of the
//! connection that has shown the least, which is closed with FATAL 53300 ([`PendingPlace::evicted`]):
//!
//! 1. a *silent* connection (no byte received from its client, checked on its socket at that moment, so a client
//!    whose startup message waits unread is not silent) before one whose login is under way;
//! 2. within that class, one of the address group holding the most places, and never one of a group holding no
//!    more than the newcomer's own group (which may lose one of its own instead);
//! 3. then the oldest: the earliest accepted silent connection, or the connection whose latest login step (its
//!    first byte, its startup message, its SCRAM messages: at most four) is the least recent.
//!
//! A group already holding its share takes the place of one of its own (chosen the same way), so it never holds
//! more. The place is given up at login: a logged-in connection is never closed to make room.
//!
//! Why this order. A real client sends its startup message right after connecting, so it is silent only until
//! those bytes arrive; from then on no silent connection, from any number of addresses and however fast they come,
//! can take its place while a silent one is left to take (and each newcomer makes one). Connections that do speak
//! (a startup message, then nothing: as cheap to open) are met by rule 2: from fewer groups than places, some group
//! of the flood holds more places than a client with a single login under way, and a newcomer takes from the
//! biggest group or from its own, so the flood only takes places from itself. What is left is a flood of speaking connections from more groups than there are places, arriving
//! faster than `max_pending_logins` per login round trip: it can close real logins under way (they get 53300 and
//! retry), and only more places help there.

use dpfusion::config::ServerSettings;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// The key a client's places are counted under: its address, an IPv4-mapped IPv6 one as IPv4 (what a dual-stack
/// listener sees), any other IPv6 one by its /64 prefix.
pub fn address_group(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// Every pre-login place, shared by the accept loop ([`PendingLogins::take`]) and the connections holding them.
pub struct PendingLogins {
    places: Mutex<Places>,
    /// Connections that lost their place and are closing slowly ([`PendingPlace::linger`]): as many as there are
    /// places, at most.
    lingering: Arc<Semaphore>,
}

/// Why a connection got no place (only when the table of places is lost): the message for the client.
const BUSY: &str = "too many connections are logging in; try again in a few seconds";

impl PendingLogins {
    /// The places of a server accepting `max_pending_logins` connections logging in.
    pub fn new(max_pending_logins: usize) -> PendingLogins {
        PendingLogins { places: Mutex::default(), lingering: Arc::new(Semaphore::new(max_pending_logins)) }
    }

    /// Gives the connection just accepted on `tcp` from `address` a place, taking one from another connection
    /// if need be (see the module docs); `Err` (the message for the client) only if the table of places is lost.
    pub fn take(
        self: &Arc<Self>,
        tcp: &TcpStream,
        address: IpAddr,
        settings: &ServerSettings,
    ) -> Result<PendingPlace, String> {
        let share = settings.pending_logins_per_address(address);
        self.take_probed(duplicate(tcp), address_group(address), share, settings.max_pending_logins)
    }

    /// [`PendingLogins::take`] for a connection of `group` allowed `share` places of `most`, its socket seen
    /// through `probe` (if there is one; otherwise the connection is judged by what it has read itself).
    fn take_probed(
        self: &Arc<Self>,
        probe: Option<std::net::TcpStream>,
        group: IpAddr,
        share: usize,
        most: usize,
    ) -> Result<PendingPlace, String> {
        let mut places = self.places.lock().map_err(|_| BUSY.to_string())?;
        let own_only = places.held_by(group) >= share;
        if own_only || places.held.len() >= most {
            let id = places.choose(group, own_only).ok_or_else(|| BUSY.to_string())?;
            if let Some(out) = places.remove(id) {
                // Its connection closes with 53300 (unless it logged in meanwhile, or is gone).
                let _ = out.evict.send(());
            }
        }
        let id = places.tick();
        let (evict, evicted) = oneshot::channel();
        places.insert(id, Held { group, since: id, silent: true, probe, evict });
        Ok(PendingPlace { id, logins: self.clone(), evicted: Some(evicted) })
    }
}

/// A second descriptor of the socket, outside the runtime: to look at without reading ([`Places::choose`]), or to
/// write on at once, whatever the runtime has yet learnt of the socket ([`super::conn`]); `None` if the system has
/// none to spare.
pub(crate) fn duplicate(tcp: &TcpStream) -> Option<std::net::TcpStream> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        tcp.as_fd().try_clone_to_owned().ok().map(std::net::TcpStream::from)
    }
    #[cfg(windows)]
    {
        use std::os::windows::io::AsSocket;
        tcp.as_socket().try_clone_to_owned().ok().map(std::net::TcpStream::from)
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = tcp;
        None
    }
}

/// The places held, indexed in the order they are taken (see the module docs).
#[derive(Default)]
struct Places {
    /// Advanced by every place given and every login step: a smaller value is older.
    clock: u64,
    /// The places held, by id (the clock when given).
    held: HashMap<u64, Held>,
    /// Each address group's places.
    groups: HashMap<IpAddr, Group>,
    /// Groups with a silent connection, the next to lose one last: by places held, then by the age of its oldest
    /// silent one.
    by_silent: BTreeSet<(usize, Reverse<u64>, IpAddr)>,
    /// Groups with a connection that has spoken, likewise: by places held, then by its least recent step.
    by_spoken: BTreeSet<(usize, Reverse<u64>, IpAddr)>,
}

/// One place.
struct Held {
    group: IpAddr,
    /// When it was given, or (once it spoke) its latest login step.
    since: u64,
    /// Nothing received from the client so far.
    silent: bool,
    probe: Option<std::net::TcpStream>,
    /// Tells the connection its place was taken.
    evict: oneshot::Sender<()>,
}

/// One address group's places: `(since, id)`, the silent and those that have spoken apart.
#[derive(Default)]
struct Group {
    silent: BTreeSet<(u64, u64)>,
    spoken: BTreeSet<(u64, u64)>,
}

impl Group {
    fn len(&self) -> usize {
        self.silent.len() + self.spoken.len()
    }

    fn class(&self, silent: bool) -> &BTreeSet<(u64, u64)> {
        if silent { &self.silent } else { &self.spoken }
    }

    fn class_mut(&mut self, silent: bool) -> &mut BTreeSet<(u64, u64)> {
        if silent { &mut self.silent } else { &mut self.spoken }
    }
}

impl Places {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn held_by(&self, group: IpAddr) -> usize {
        self.groups.get(&group).map_or(0, Group::len)
    }

    fn index(&mut self, silent: bool) -> &mut BTreeSet<(usize, Reverse<u64>, IpAddr)> {
        if silent { &mut self.by_silent } else { &mut self.by_spoken }
    }

    /// Runs `change` on `group`'s places (created if missing, dropped once empty), keeping the indexes in step.
    fn change_group(&mut self, group: IpAddr, change: impl FnOnce(&mut Group)) {
        let mut g = self.groups.remove(&group).unwrap_or_default();
        for silent in [true, false] {
            if let Some(&(since, _)) = g.class(silent).first() {
                let n = g.len();
                self.index(silent).remove(&(n, Reverse(since), group));
            }
        }
        change(&mut g);
        if g.len() == 0 {
            return;
        }
        for silent in [true, false] {
            if let Some(&(since, _)) = g.class(silent).first() {
                let n = g.len();
                self.index(silent).insert((n, Reverse(since), group));
            }
        }
        self.groups.insert(group, g);
    }

    fn insert(&mut self, id: u64, held: Held) {
        let key = (held.since, id);
        let (group, silent) = (held.group, held.silent);
        self.held.insert(id, held);
        self.change_group(group, |g| {
            g.class_mut(silent).insert(key);
        });
    }

    fn remove(&mut self, id: u64) -> Option<Held> {
        let held = self.held.remove(&id)?;
        let (key, silent) = ((held.since, id), held.silent);
        self.change_group(held.group, |g| {
            g.class_mut(silent).remove(&key);
        });
        Some(held)
    }

    /// Place `id`'s client made a login step: it has spoken, and its step is the most recent.
    fn step(&mut self, id: u64) {
        let now = self.tick();
        let Some(held) = self.held.get_mut(&id) else { return };
        let (old, silent, group) = ((held.since, id), held.silent, held.group);
        (held.since, held.silent) = (now, false);
        self.change_group(group, |g| {
            g.class_mut(silent).remove(&old);
            g.spoken.insert((now, id));
        });
    }

    /// The place a newcomer of `group` takes (`own_only`: the group holds its share): the first of [`Places::candidate`]
    /// that is still silent on its socket, or has spoken.
    fn choose(&mut self, group: IpAddr, own_only: bool) -> Option<u64> {
        loop {
            let id = self.candidate(group, own_only)?;
            if !self.bytes_waiting(id) {
                return Some(id);
            }
            // Its client has sent bytes this connection has not read yet: it has spoken. (Each pass moves one
            // place out of the silent class, so this ends.)
            self.step(id);
        }
    }

    /// The place to take for a newcomer of `group`, by the module docs' order, going by what the connections have
    /// read themselves.
    fn candidate(&self, group: IpAddr, own_only: bool) -> Option<u64> {
        let mine = self.held_by(group);
        for (silent, index) in [(true, &self.by_silent), (false, &self.by_spoken)] {
            let from = match index.last() {
                Some(&(n, _, biggest)) if !own_only && n > mine => Some(biggest),
                _ => self.groups.get(&group).filter(|g| !g.class(silent).is_empty()).map(|_| group),
            };
            if let Some(from) = from {
                return self.groups.get(&from)?.class(silent).first().map(|&(_, id)| id);
            }
        }
        None
    }

    /// Whether place `id` is silent by its own account but bytes from its client wait on its socket.
    fn bytes_waiting(&self, id: u64) -> bool {
        let Some(held) = self.held.get(&id) else { return false };
        held.silent && held.probe.as_ref().is_some_and(|p| matches!(p.peek(&mut [0u8; 1]), Ok(n) if n > 0))
    }
}

/// A connection's pre-login place; given back when dropped (at login, or when the connection ends).
pub struct PendingPlace {
    id: u64,
    logins: Arc<PendingLogins>,
    /// Told when the place is given to a newer connection; `None` once [`PendingPlace::eviction`] took it.
    evicted: Option<oneshot::Receiver<()>>,
}

/// The news that a place was given to a newer connection, watched apart from the place
/// ([`PendingPlace::eviction`]).
pub struct Eviction(oneshot::Receiver<()>);

impl Eviction {
    /// Completes once the place was given to a newer connection; never if it was given back instead (dropped).
    /// Not to be awaited again after it completed.
    pub async fn evicted(&mut self) {
        if (&mut self.0).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl PendingPlace {
    /// Its client made a step of the login (its first byte, its startup message, a SCRAM message): it is no
    /// longer silent, and among those that have spoken, the last to lose its place.
    pub fn step(&self) {
        if let Ok(mut places) = self.logins.places.lock() {
            places.step(self.id);
        }
    }

    /// Completes once the place was given to a newer connection (see the module docs). Not to be awaited again
    /// after it completed.
    pub(crate) async fn evicted(&mut self) {
        match &mut self.evicted {
            Some(evicted) => {
                let _ = evicted.await;
            }
            None => std::future::pending().await,
        }
    }

    /// Its eviction, to watch apart from the place (which someone else may hold, and drop when the connection
    /// has logged in); [`PendingPlace::evicted`] then never completes.
    pub fn eviction(&mut self) -> Option<Eviction> {
        self.evicted.take().map(Eviction)
    }

    /// Leave for a connection that lost its place to take its time closing (to read what its client still sends,
    /// so that the client reads the error rather than a reset); `None` when as many connections as there are
    /// places are doing so already (a flood cannot make the server hold more connections than it has places).
    pub(crate) fn linger(&self) -> Option<OwnedSemaphorePermit> {
        self.logins.lingering.clone().try_acquire_owned().ok()
    }
}

impl Drop for PendingPlace {
    fn drop(&mut self) {
        if let Ok(mut places) = self.logins.places.lock() {
            places.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Takes a place for a connection from `address` (a share of `share` of `most` places), with no socket.
    fn take(logins: &Arc<PendingLogins>, address: &str, share: usize, most: usize) -> PendingPlace {
        logins.take_probed(None, address_group(ip(address)), share, most).unwrap()
    }

    fn is_evicted(p: &mut PendingPlace) -> bool {
        p.evicted.as_mut().is_some_and(|e| e.try_recv().is_ok())
    }

    #[test]
    fn a_silent_place_goes_before_one_under_way_then_the_biggest_group_then_the_oldest() {
        let logins = Arc::new(PendingLogins::new(100));
        let mut a = [take(&logins, "10.0.0.1", 8, 5), take(&logins, "10.0.0.1", 8, 5)];
        let mut b = [take(&logins, "10.0.0.2", 8, 5), take(&logins, "10.0.0.2", 8, 5), take(&logins, "10.0.0.2", 8, 5)];
        // b's first has spoken: b's second is the oldest silent place of the biggest group.
        b[0].step();
        let c = take(&logins, "10.0.0.3", 8, 5);
        assert_eq!(b.each_mut().map(is_evicted), [false, true, false]);
        // Two groups of two now: the oldest silent place of either (a's first).
        let d = take(&logins, "10.0.0.4", 8, 5);
        assert_eq!(a.each_mut().map(is_evicted), [true, false]);
        // Everyone has spoken: the least recent step of the biggest group (b's first spoke before b's third).
        b[2].step();
        a[1].step();
        c.step();
        d.step();
        let _e = take(&logins, "10.0.0.5", 8, 5);
        assert_eq!(b.each_mut().map(is_evicted), [true, false, false]);
        assert!(!is_evicted(&mut a[1]));
    }

    #[test]
    fn a_newcomer_never_takes_a_place_from_a_smaller_group() {
        let logins = Arc::new(PendingLogins::new(100));
        let mut lone = take(&logins, "10.0.0.9", 8, 4);
        let mut flood: Vec<_> = (0..3).map(|_| take(&logins, "10.0.0.1", 8, 4)).collect();
        // The flood's group holds three places, the lone client one (silent and older): the flood's newcomers
        // take from the flood.
        for _ in 0..10 {
            flood.push(take(&logins, "10.0.0.1", 8, 4));
        }
        assert!(!is_evicted(&mut lone));
        assert_eq!(flood.iter_mut().map(is_evicted).filter(|e| !e).count(), 3);
        // A group as big as the newcomer's is not taken from either: two groups of two, and one newcomer each.
        let logins = Arc::new(PendingLogins::new(100));
        let _b = [take(&logins, "10.0.0.2", 8, 4), take(&logins, "10.0.0.2", 8, 4)];
        let mut a = [take(&logins, "10.0.0.1", 8, 4), take(&logins, "10.0.0.1", 8, 4)];
        let _a3 = take(&logins, "10.0.0.1", 8, 4);
        assert_eq!(a.each_mut().map(is_evicted), [true, false], "its own oldest, though b's are older");
    }

    #[test]
    fn a_group_at_its_share_takes_from_itself_and_a_place_is_given_back_on_drop() {
        let logins = Arc::new(PendingLogins::new(100));
        let mut other = take(&logins, "10.0.0.2", 2, 100);
        let mut mine = [take(&logins, "10.0.0.1", 2, 100), take(&logins, "10.0.0.1", 2, 100)];
        mine[0].step();
        let third = take(&logins, "10.0.0.1", 2, 100);
        assert_eq!(mine.each_mut().map(is_evicted), [false, true], "its own silent one, not another's");
        assert!(!is_evicted(&mut other));
        drop(third);
        drop(other);
        let places = logins.places.lock().unwrap();
        assert_eq!(
            (places.held.len(), places.groups.len(), places.by_silent.len(), places.by_spoken.len()),
            (1, 1, 0, 1)
        );
    }

    #[test]
    fn ipv6_clients_count_by_their_64_prefix_and_mapped_ipv4_as_ipv4() {
        assert_eq!(address_group(ip("2001:db8:1:2:aaaa::1")), address_group(ip("2001:db8:1:2:bbbb::7")));
        assert_ne!(address_group(ip("2001:db8:1:2::1")), address_group(ip("2001:db8:1:3::1")));
        assert_eq!(address_group(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        let logins = Arc::new(PendingLogins::new(100));
        let mut first = take(&logins, "2001:db8::1", 1, 100);
        let _second = take(&logins, "2001:db8::2", 1, 100);
        assert!(is_evicted(&mut first), "one /64, one share");
    }

    #[test]
    fn bytes_waiting_on_a_socket_make_it_not_silent() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let accept = || {
            let (s, _) = listener.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            s
        };
        let mut speaking = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (spoke, _quiet) = (accept(), std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        let quiet = accept();
        speaking.write_all(b"\0\0\0\x08").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let logins = Arc::new(PendingLogins::new(100));
        let group = address_group(ip("127.0.0.1"));
        let mut older = logins.take_probed(Some(spoke), group, 8, 2).unwrap();
        let mut younger = logins.take_probed(Some(quiet), group, 8, 2).unwrap();
        let _new = logins.take_probed(None, address_group(ip("127.0.0.2")), 8, 2).unwrap();
        assert_eq!([is_evicted(&mut older), is_evicted(&mut younger)], [false, true]);
    }
}
