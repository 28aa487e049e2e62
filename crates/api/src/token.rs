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
}
