//! SCRAM-SHA-256 (RFC 5802 with RFC 7677's hash) on the server side, against PostgreSQL-format verifiers.
//!
//! The ledger stores, per analyst, only `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (made by
//! `postgres-protocol`, as PostgreSQL's own `ALTER ROLE ... PASSWORD` does): StoredKey = H(HMAC(SaltedPassword,
//! "Client Key")) cannot be used to log in, and neither it nor ServerKey gives back the password. (pgwire's own
//! SCRAM handler needs the SaltedPassword itself, which *is* enough to log in; that is why this exchange is ours.)
//!
//! The exchange: the client sends `n,,n=,r=<client nonce>`; the server answers `r=<client nonce><server
//! nonce>,s=<salt>,i=<iterations>`; the client proves it knows the password with `c=biws,r=<nonce>,p=<proof>`,
//! where proof = ClientKey ⊕ HMAC(StoredKey, AuthMessage); the server checks H(proof ⊕ HMAC(StoredKey,
//! AuthMessage)) = StoredKey and sends `v=HMAC(ServerKey, AuthMessage)`. Channel binding (SCRAM-SHA-256-PLUS) is
//! not offered; under TLS the client authenticates the server by its certificate.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::{digest, hmac};

/// The SASL mechanism name.
pub const MECHANISM: &str = "SCRAM-SHA-256";

/// A stored verifier, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verifier {
    iterations: u32,
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

/// A new verifier for `password`, with a random salt (PostgreSQL's format; 4096 iterations).
pub fn verifier(password: &str) -> String {
    postgres_protocol::password::scram_sha_256(password.as_bytes())
}

impl Verifier {
    /// Parses `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    pub fn parse(text: &str) -> Option<Verifier> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let v = Verifier {
            iterations: iterations.parse().ok()?,
            salt: STANDARD.decode(salt).ok()?,
            stored_key: STANDARD.decode(stored).ok()?,
            server_key: STANDARD.decode(server).ok()?,
        };
        (v.iterations > 0 && v.stored_key.len() == 32 && v.server_key.len() == 32).then_some(v)
    }

    /// A verifier no password matches, with a salt derived from `user` and a server secret: what an unknown
    /// (or disabled) user is challenged with, so that the exchange looks the same whether the user exists or not.
    pub fn decoy(user: &str, secret: &[u8; 32]) -> Verifier {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let tag = |label: &str| hmac::sign(&key, format!("{label}\0{user}").as_bytes()).as_ref().to_vec();
        Verifier {
            iterations: 4096,
            salt: tag("salt")[..16].to_vec(),
            stored_key: tag("stored"),
            server_key: tag("server"),
        }
    }
}

/// Why an exchange failed.
#[derive(Debug, PartialEq, Eq)]
pub enum ScramError {
    /// The client's message is not SCRAM as we speak it (the text says what).
    Protocol(String),
    /// The proof does not match: wrong password (or unknown user).
    WrongPassword,
}

/// The server's state after its first message.
#[derive(Debug)]
pub struct ServerFirst {
    verifier: Verifier,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

fn protocol(m: &str) -> ScramError {
    ScramError::Protocol(m.to_string())
}

/// Handles the client-first message with the user's `verifier`: returns the server-first message to send and
/// the state to check the client's proof with. `server_nonce` is fresh randomness (printable, no comma).
pub fn client_first(
    message: &[u8],
    verifier: Verifier,
    server_nonce: &str,
) -> Result<(String, ServerFirst), ScramError> {
    let text = std::str::from_utf8(message).map_err(|_| protocol("client-first-message is not UTF-8"))?;
    // gs2-header: a channel-binding flag, an optional authzid, then the bare message.
    let mut parts = text.splitn(3, ',');
    let (flag, authzid, bare) = match (parts.next(), parts.next(), parts.next()) {
        (Some(f), Some(a), Some(b)) => (f, a, b),
        _ => return Err(protocol("malformed client-first-message")),
    };
    match flag {
        "n" | "y" => {}
        _ if flag.starts_with("p=") => return Err(protocol("channel binding is not offered by this server")),
        _ => return Err(protocol("malformed channel-binding flag")),
    }
    if !authzid.is_empty() {
        return Err(protocol("an authorization identity is not supported"));
    }
    let mut client_nonce = None;
    for attr in bare.split(',') {
        match attr.split_once('=') {
            Some(("r", v)) if !v.is_empty() => client_nonce = Some(v),
            Some(("n", _)) => {} // PostgreSQL takes the user from the startup message, not from here
            Some(("m", _)) => return Err(protocol("mandatory SCRAM extensions are not supported")),
            _ => return Err(protocol("malformed client-first-message attribute")),
        }
    }
    let client_nonce = client_nonce.ok_or_else(|| protocol("client-first-message has no nonce"))?;
    if !client_nonce.chars().all(|c| c.is_ascii_graphic() && c != ',') {
        return Err(protocol("the client nonce has characters SCRAM does not allow"));
    }
    let nonce = format!("{client_nonce}{server_nonce}");
    let server_first = format!("r={nonce},s={},i={}", STANDARD.encode(&verifier.salt), verifier.iterations);
    let state = ServerFirst {
        verifier,
        gs2_header: format!("{flag},{authzid},"),
        client_first_bare: bare.to_string(),
        server_first: server_first.clone(),
        nonce,
    };
    Ok((server_first, state))
}

impl ServerFirst {
    /// Checks the client-final message; on success returns the server-final message (`v=...`).
    pub fn client_final(&self, message: &[u8]) -> Result<String, ScramError> {
        let text = std::str::from_utf8(message).map_err(|_| protocol("client-final-message is not UTF-8"))?;
        let (without_proof, proof) =
            text.rsplit_once(",p=").ok_or_else(|| protocol("client-final-message has no proof"))?;
        let mut binding = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            match attr.split_once('=') {
                Some(("c", v)) => binding = Some(v),
                Some(("r", v)) => nonce = Some(v),
                _ => return Err(protocol("malformed client-final-message attribute")),
            }
        }
        if binding != Some(STANDARD.encode(&self.gs2_header).as_str()) {
            return Err(protocol("channel binding does not match"));
        }
        if nonce != Some(self.nonce.as_str()) {
            return Err(protocol("nonce does not match"));
        }
        let proof = STANDARD.decode(proof).map_err(|_| protocol("the proof is not base64"))?;
        let auth_message = format!("{},{},{without_proof}", self.client_first_bare, self.server_first);
        let stored = hmac::Key::new(hmac::HMAC_SHA256, &self.verifier.stored_key);
        let signature = hmac::sign(&stored, auth_message.as_bytes());
        if proof.len() != signature.as_ref().len() {
            return Err(ScramError::WrongPassword);
        }
        let client_key: Vec<u8> = proof.iter().zip(signature.as_ref()).map(|(a, b)| a ^ b).collect();
        let computed = digest::digest(&digest::SHA256, &client_key);
        // Constant time: compare HMACs of both sides under a fresh key rather than the bytes themselves.
        let k = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .map_err(|_| protocol("no randomness"))?;
        let expected = hmac::sign(&k, &self.verifier.stored_key);
        if hmac::verify(&k, computed.as_ref(), expected.as_ref()).is_err() {
            return Err(ScramError::WrongPassword);
        }
        let server = hmac::Key::new(hmac::HMAC_SHA256, &self.verifier.server_key);
        Ok(format!("v={}", STANDARD.encode(hmac::sign(&server, auth_message.as_bytes()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client side of the exchange, as RFC 5802 computes it (from the password, not from the verifier).
    fn client_proof(password: &str, server_first: &str, client_first_bare: &str, without_proof: &str) -> String {
        let attrs: std::collections::HashMap<&str, &str> =
            server_first.split(',').filter_map(|a| a.split_once('=')).collect();
        let salt = STANDARD.decode(attrs["s"]).unwrap();
        let iterations: u32 = attrs["i"].parse().unwrap();
        let mut salted = [0u8; 32];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(iterations).unwrap(),
            &salt,
            password.as_bytes(),
            &mut salted,
        );
        let client_key = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &salted), b"Client Key");
        let stored = digest::digest(&digest::SHA256, client_key.as_ref());
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, stored.as_ref()), auth.as_bytes());
        let proof: Vec<u8> = client_key.as_ref().iter().zip(sig.as_ref()).map(|(a, b)| a ^ b).collect();
        STANDARD.encode(proof)
    }

    fn exchange(stored_for: &str, password: &str) -> Result<String, ScramError> {
        let v = Verifier::parse(&verifier(stored_for)).unwrap();
        let (server_first, state) = client_first(b"n,,n=,r=abcDEF123", v, "srv456").unwrap();
        assert!(server_first.starts_with("r=abcDEF123srv456,s="), "{server_first}");
        let without_proof = "c=biws,r=abcDEF123srv456";
        let proof = client_proof(password, &server_first, "n=,r=abcDEF123", without_proof);
        state.client_final(format!("{without_proof},p={proof}").as_bytes())
    }

    #[test]
    fn the_right_password_passes_and_a_wrong_one_fails() {
        assert!(exchange("correct horse", "correct horse").unwrap().starts_with("v="));
        assert_eq!(exchange("correct horse", "correct horsf"), Err(ScramError::WrongPassword));
        assert_eq!(exchange("pässwörd", "pässwörd").map(|s| s.len() > 2), Ok(true));
    }

    #[test]
    fn the_stored_verifier_is_not_the_password_nor_a_login_secret() {
        let v = verifier("hunter2");
        assert!(v.starts_with("SCRAM-SHA-256$4096:") && !v.contains("hunter2"), "{v}");
        // Two verifiers of one password differ (random salt).
        assert_ne!(v, verifier("hunter2"));
    }

    #[test]
    fn malformed_messages_are_protocol_errors() {
        let v = || Verifier::parse(&verifier("x")).unwrap();
        for bad in [&b"garbage"[..], b"p=tls-server-end-point,,n=,r=x", b"n,,n=,m=ext,r=x", b"n,,n=", b"\xff\xfe"] {
            assert!(matches!(client_first(bad, v(), "s"), Err(ScramError::Protocol(_))), "{bad:?}");
        }
        let (_, state) = client_first(b"n,,n=,r=abc", v(), "def").unwrap();
        for bad in ["c=biws,r=abcdef", "c=biws,r=WRONG,p=AAAA", "c=eSws,r=abcdef,p=AAAA", "c=biws,r=abcdef,p=!!"] {
            assert!(matches!(state.client_final(bad.as_bytes()), Err(ScramError::Protocol(_))), "{bad}");
        }
        assert_eq!(state.client_final(b"c=biws,r=abcdef,p=AAAA"), Err(ScramError::WrongPassword));
    }

    #[test]
    fn a_decoy_is_stable_per_user_and_matches_no_password() {
        let secret = [7u8; 32];
        assert_eq!(Verifier::decoy("bob", &secret), Verifier::decoy("bob", &secret));
        assert_ne!(Verifier::decoy("bob", &secret).salt, Verifier::decoy("eve", &secret).salt);
        let (server_first, state) = client_first(b"n,,n=,r=abc", Verifier::decoy("bob", &secret), "def").unwrap();
        let proof = client_proof("", &server_first, "n=,r=abc", "c=biws,r=abcdef");
        assert_eq!(state.client_final(format!("c=biws,r=abcdef,p={proof}").as_bytes()), Err(ScramError::WrongPassword));
    }
}
