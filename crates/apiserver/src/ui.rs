//! The global view (`/ui`): one page built into the binary, with its styles and script
//! inline, that reads the fleet through the APIs with the user's token. Nothing is fetched
//! from anywhere else (its Content-Security-Policy says so).

use http::{Method, Response, StatusCode};

use crate::error::ApiError;
use crate::http::{self as h, Body};

const PAGE: &str = include_str!("ui/index.html");

const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// `GET /ui`.
pub fn page(method: &Method) -> Result<Response<Body>, ApiError> {
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on /ui"
        )));
    }
    let mut r = Response::new(h::full(PAGE));
    *r.status_mut() = StatusCode::OK;
    let headers = r.headers_mut();
    for (k, v) in [
        ("content-type", "text/html; charset=utf-8"),
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("cache-control", "no-cache"),
        ("referrer-policy", "no-referrer"),
    ] {
        headers.insert(k, http::HeaderValue::from_static(v));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_small_and_self_contained() {
        assert!(PAGE.len() < 300 * 1024);
        // No network fetches from the page but to its own server.
        for banned in ["http://", "https://", "src=\"//", "@import"] {
            assert!(!PAGE.contains(banned), "{banned}");
        }
        let r = page(&Method::GET).unwrap();
        assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
        assert!(page(&Method::POST).is_err());
    }
}
