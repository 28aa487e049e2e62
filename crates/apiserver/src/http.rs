//! HTTP plumbing: bodies, JSON responses, `Status` error responses, content negotiation and
//! query parameters.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::error::ApiError;

/// How long a connection has for its TLS handshake and each request's headers by default.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may sit with no request in progress by default (kube-apiserver's
/// idle timeout).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Connections one source address may hold by default: a fleet of agents behind one NAT, or
/// every member of a load test on loopback, fits.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 4096;

/// What one connection may hold (see `server`'s doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// 0: no limit.
    pub max_per_source: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
        }
    }
}

pub type Body = BoxBody<Bytes, Infallible>;

pub const JSON: &str = "application/json";
/// What client-go asks for to get aggregated discovery, and checks in the answer.
pub const DISCOVERY_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
pub const DISCOVERY_V2_BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub fn empty() -> Body {
    full(Bytes::new())
}

/// A JSON response.
pub fn json(status: StatusCode, value: &Value) -> Response<Body> {
    json_typed(status, value, JSON)
}

pub fn json_typed(status: StatusCode, value: &Value, content_type: &str) -> Response<Body> {
    // Serializing a Value cannot fail.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut r = Response::new(full(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_str(content_type).unwrap_or(HeaderValue::from_static(JSON)),
    );
    r
}

/// The `Status` response of an error.
pub fn error(e: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json(status, &e.to_status());
    if let Some(s) = e.retry_after_seconds() {
        r.headers_mut().insert("Retry-After", HeaderValue::from(s));
    }
    r
}

/// One entry of an `Accept` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaType {
    pub essence: String,
    pub params: HashMap<String, String>,
}

/// Parses an `Accept` header into its media types, in order.
pub fn accept(headers: &HeaderMap) -> Vec<MediaType> {
    let raw = headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    raw.split(',')
        .filter_map(|part| {
            let mut pieces = part.split(';');
            let essence = pieces.next()?.trim().to_ascii_lowercase();
            if essence.is_empty() {
                return None;
            }
            let params = pieces
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
                })
                .collect();
            Some(MediaType { essence, params })
        })
        .collect()
}

/// What representation a client wants for objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Representation {
    Json,
    Table,
    /// `PartialObjectMetadata` (`as=PartialObjectMetadata`).
    Metadata,
}

fn json_like(m: &MediaType) -> bool {
    matches!(
        m.essence.as_str(),
        "application/json" | "application/*" | "*/*"
    )
}

/// Chooses the representation; `Err` when only formats we do not speak (protobuf) are acceptable.
pub fn representation(headers: &HeaderMap) -> Result<Representation, ApiError> {
    let types = accept(headers);
    if types.is_empty() {
        return Ok(Representation::Json);
    }
    for m in &types {
        if m.essence == "application/json"
            && m.params.get("g").map(String::as_str) == Some("meta.k8s.io")
        {
            match m.params.get("as").map(String::as_str) {
                Some("Table") => return Ok(Representation::Table),
                Some("PartialObjectMetadata") | Some("PartialObjectMetadataList") => {
                    return Ok(Representation::Metadata);
                }
                _ => {}
            }
        } else if json_like(m) && !m.params.contains_key("as") {
            return Ok(Representation::Json);
        }
    }
    Err(ApiError::not_acceptable(
        "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io",
    ))
}

/// Whether a client asked for aggregated discovery (and will accept it).
pub fn wants_aggregated_discovery(headers: &HeaderMap) -> Option<&'static str> {
    for m in accept(headers) {
        if m.essence == "application/json"
            && m.params.get("g").map(String::as_str) == Some("apidiscovery.k8s.io")
            && m.params.get("as").map(String::as_str) == Some("APIGroupDiscoveryList")
        {
            match m.params.get("v").map(String::as_str) {
                Some("v2") => return Some(DISCOVERY_V2),
                Some("v2beta1") => return Some(DISCOVERY_V2_BETA1),
                _ => {}
            }
        }
    }
    None
}

/// Query parameters; repeated keys keep the last value, as Kubernetes does for its options.
#[derive(Clone, Debug, Default)]
pub struct Query(HashMap<String, String>);

impl Query {
    pub fn parse(query: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// `true`, `1` (and a bare key) are true; `false`/`0` are false.
    pub fn flag(&self, k: &str) -> Result<bool, ApiError> {
        match self.0.get(k).map(String::as_str) {
            None | Some("false") | Some("0") => Ok(false),
            Some("") | Some("true") | Some("1") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid value {other:?} for {k}: must be true or false"
            ))),
        }
    }

    pub fn number<T: std::str::FromStr>(&self, k: &str) -> Result<Option<T>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("invalid value {v:?} for {k}: must be a number"))
            }),
        }
    }
}

/// Whether a query asks for a watch (`watch=true`, `1`, or the bare key), as the REST
/// handlers read it.
pub fn asks_to_watch(query: Option<&str>) -> bool {
    Query::parse(query).flag("watch").unwrap_or(false)
}

/// Reads a request body up to `limit` bytes: 413 beyond it.
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::too_large(limit))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body: {e}"
        ))),
    }
}

/// Adds `Warning: 299` headers.
pub fn with_warnings(mut r: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append("Warning", v);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(accept: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        h
    }

    #[test]
    fn negotiation() {
        let kubectl_get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            representation(&headers(kubectl_get)).unwrap(),
            Representation::Table
        );
        assert_eq!(
            representation(&headers("application/json")).unwrap(),
            Representation::Json
        );
        assert_eq!(
            representation(&headers("*/*")).unwrap(),
            Representation::Json
        );
        assert_eq!(
            representation(&HeaderMap::new()).unwrap(),
            Representation::Json
        );
        assert_eq!(
            representation(&headers(
                "application/vnd.kubernetes.protobuf, application/json"
            ))
            .unwrap(),
            Representation::Json
        );
        assert!(representation(&headers("application/vnd.kubernetes.protobuf")).is_err());
        let discovery = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(
            wants_aggregated_discovery(&headers(discovery)),
            Some(DISCOVERY_V2)
        );
        assert_eq!(
            wants_aggregated_discovery(&headers("application/json")),
            None
        );
    }

    #[test]
    fn query_flags() {
        let q = Query::parse(Some(
            "watch=true&limit=5&labelSelector=a%3Db&x=maybe&empty=",
        ));
        assert!(q.flag("watch").unwrap());
        assert!(!q.flag("missing").unwrap());
        assert!(q.flag("x").is_err());
        assert_eq!(q.number::<usize>("limit").unwrap(), Some(5));
        assert_eq!(q.get("labelSelector"), Some("a=b"));
        assert_eq!(q.get("empty"), None);
    }
}
