//! Bootstrap tokens, as `orrery token create` prints them and agents read them:
//! `ORR1<sha256 of the server's CA bundle, hex>::<id>.<secret>`. The hash lets an agent given
//! only a URL and a token fetch the server's CA and know it is the right one (as k3s tokens
//! do); a bare `<id>.<secret>` works too, with the CA given some other way.

use sha2::{Digest, Sha256};

pub const BOOTSTRAP_PREFIX: &str = "ORR1";

/// The hex SHA-256 of a CA bundle (PEM text, byte for byte as the server serves it).
pub fn ca_hash(ca_pem: &str) -> String {
    Sha256::digest(ca_pem.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `ORR1<ca hash>::<credential>`.
pub fn bootstrap(ca_pem: &str, credential: &str) -> String {
    format!("{BOOTSTRAP_PREFIX}{}::{credential}", ca_hash(ca_pem))
}

/// What of `bundle` (as fetched, unverified) a token pinning `hash` lets an agent trust: the
/// whole bundle when the hash is the bundle's, or the one certificate whose hash it is (a
/// token minted before the server began to trust a second CA, during a rotation). Never more
/// than what was pinned: a bundle with an extra certificate beside the pinned one earns
/// trust in the pinned one alone, and the rest is learnt later over a verified connection.
pub fn trusted_part(bundle: &str, hash: &str) -> Option<String> {
    if ca_hash(bundle) == hash {
        return Some(bundle.to_string());
    }
    certificates(bundle).find(|c| ca_hash(c) == hash)
}

/// The certificates of a PEM bundle, each as its own PEM text (ending in a newline, as the
/// server writes them).
pub fn certificates(bundle: &str) -> impl Iterator<Item = String> + '_ {
    const END: &str = "-----END CERTIFICATE-----";
    bundle.split_inclusive(END).filter_map(|part| {
        let start = part.find("-----BEGIN CERTIFICATE-----")?;
        part.ends_with(END).then(|| format!("{}\n", &part[start..]))
    })
}

/// Splits a token into (CA hash, credential); a bare credential has no hash.
pub fn parse(token: &str) -> (Option<&str>, &str) {
    match token
        .strip_prefix(BOOTSTRAP_PREFIX)
        .and_then(|t| t.split_once("::"))
    {
        Some((hash, cred)) => (Some(hash), cred),
        None => (None, token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_the_ca_hash() {
        let t = bootstrap("PEM", "abcd.1234");
        assert!(t.starts_with("ORR1"));
        let (hash, cred) = parse(&t);
        assert_eq!(hash, Some(ca_hash("PEM").as_str()));
        assert_eq!(hash.map(str::len), Some(64));
        assert_eq!(cred, "abcd.1234");
        assert_eq!(parse("abcd.1234"), (None, "abcd.1234"));
        assert_ne!(ca_hash("PEM"), ca_hash("PEM\n"));
    }

    #[test]
    fn a_pinned_certificate_earns_trust_in_itself_alone() {
        let a = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let b = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";
        let bundle = format!("{a}{b}");
        assert_eq!(certificates(&bundle).collect::<Vec<_>>(), vec![a, b]);
        assert_eq!(
            trusted_part(&bundle, &ca_hash(&bundle)),
            Some(bundle.clone())
        );
        assert_eq!(trusted_part(&bundle, &ca_hash(a)).as_deref(), Some(a));
        assert_eq!(trusted_part(&bundle, &ca_hash(b)).as_deref(), Some(b));
        assert_eq!(trusted_part(a, &ca_hash(b)), None, "not there");
        assert_eq!(trusted_part(&bundle, &ca_hash("x")), None);
        // A truncated block is no certificate.
        assert_eq!(certificates("-----BEGIN CERTIFICATE-----\nAA").count(), 0);
    }
}
