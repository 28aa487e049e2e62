//! Step 3: the audit log's stages for a request (`RequestReceived`, `ResponseStarted` for a
//! watch, `ResponseComplete`), at the level its policy gives the request.

use std::sync::Arc;

use http::{Method, Request, Response};
use http_body_util::BodyExt;

use super::{Answer, Caller, Identified, Next, Req, read_body, refuse};
use crate::app::App;
use crate::audit::{Level, Record, Stage};
use crate::http as h;

pub(super) async fn audit(app: Arc<App>, req: Req, next: Next) -> Answer {
    let Some(log) = app.config.audit.clone() else {
        return next.run(req).await;
    };
    // The policy is decided for the caller the credentials name, before the request is
    // served (and before an unauthenticated one is refused: it is recorded too).
    let who = req
        .extensions()
        .get::<Identified>()
        .and_then(|i| i.0.clone().ok());
    let info = crate::audit::request_info(req.method(), req.uri().path(), req.uri().query());
    let decision = log.policy.decide(who.as_ref(), &info);
    if decision.level == Level::None {
        return next.run(req).await;
    }
    let source_ips = req
        .extensions()
        .get::<crate::audit::Peer>()
        .map(|p| vec![p.0.ip().to_string()])
        .unwrap_or_default();
    let uri = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.to_string());
    let user_agent = req
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut rec = Record::new(decision, info, who.as_ref(), uri, user_agent, source_ips);
    // The policy was decided for the caller, as Kubernetes decides it; the Event also
    // names whom the request acted as, once that was allowed.
    if let Some(w) = &who
        && let Ok((acting, Some(how))) =
            crate::impersonation::apply(&app.authz, w.clone(), req.headers())
    {
        rec.impersonating(&acting, &how);
    }
    if let Some(line) = rec.line(Stage::RequestReceived, None) {
        log.write(line).await;
    }
    let with_body = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let response = if rec.decision.level >= Level::Request && with_body {
        let path = req.uri().path().to_string();
        let (parts, body) = req.into_parts();
        match app.read_request_body(body).await {
            Ok(bytes) => {
                rec.request_object = body_as_json(&app, &parts, rec.info.object.as_ref(), &bytes);
                next.run(Request::from_parts(parts, read_body(bytes))).await
            }
            Err(e) => {
                let mut answer = refuse(&path, &e);
                let user = who.as_ref().map(crate::auth::Identity::user);
                answer
                    .extensions_mut()
                    .insert(Caller(user.unwrap_or_default()));
                answer
            }
        }
    } else {
        next.run(req).await
    };
    let code = response.status().as_u16();
    if rec.info.verb == "watch" {
        // The stream goes on: its start is what is logged.
        if let Some(line) = rec.line(Stage::ResponseStarted, Some(code)) {
            log.write(line).await;
        }
        return response;
    }
    let response = if rec.decision.level >= Level::RequestResponse {
        let (parts, body) = response.into_parts();
        let bytes = match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(never) => match never {},
        };
        rec.response_object = serde_json::from_slice(&bytes).ok();
        Response::from_parts(parts, h::full(bytes))
    } else {
        response
    };
    if let Some(line) = rec.line(Stage::ResponseComplete, Some(code)) {
        log.write(line).await;
    }
    response
}

/// A request body as JSON for the audit log, whichever of JSON, YAML (server-side apply)
/// or protobuf (kubectl's creates of built-in kinds) it came in.
fn body_as_json(
    app: &App,
    parts: &http::request::Parts,
    object: Option<&crate::audit::ObjectRef>,
    bytes: &[u8],
) -> Option<serde_json::Value> {
    if let Ok(v) = serde_json::from_slice(bytes) {
        return Some(v);
    }
    let ct = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if ct.contains("protobuf") {
        let o = object?;
        let rt = app
            .resources
            .snapshot()
            .get(&o.api_group, &o.api_version, &o.resource)?;
        return crate::protobuf::decode(bytes, &rt.schema).ok();
    }
    serde_saphyr::from_slice(bytes).ok()
}
