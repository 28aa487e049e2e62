//! The OpenAPI 3 description of the DRO-DS endpoints, served at `/api/v1/openapi.json`.

use serde_json::{Value, json};

/// The stable error codes (draft 6.1), each with the HTTP status it comes with.
pub const ERROR_CODES: &[(&str, u16)] = &[
    ("VALIDATION_FAILED", 400),
    ("UNAUTHORIZED", 401),
    ("FORBIDDEN", 403),
    ("NOT_FOUND", 404),
    ("CLUSTER_NOT_FOUND", 404),
    ("POLICY_NOT_FOUND", 404),
    ("BINDING_NOT_FOUND", 404),
    ("METHOD_NOT_ALLOWED", 405),
    ("CLUSTER_EXISTS", 409),
    ("POLICY_CONFLICT", 409),
    ("BINDING_EXISTS", 409),
    ("CONFLICT", 409),
    ("PAYLOAD_TOO_LARGE", 413),
    ("BATCH_TOO_LARGE", 413),
    ("UNSUPPORTED_MEDIA_TYPE", 415),
    ("TOO_MANY_REQUESTS", 429),
    ("INTERNAL", 500),
    ("UNAVAILABLE", 503),
];

fn error(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    })
}

fn ok(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}},
    })
}

fn body(schema: &str, content_type: &str) -> Value {
    json!({
        "required": true,
        "content": {content_type: {"schema": {"$ref": format!("#/components/schemas/{schema}")}}},
    })
}

/// Responses every call may give.
fn common(mut responses: serde_json::Map<String, Value>) -> Value {
    responses.insert(
        "401".into(),
        error("UNAUTHORIZED: no or a bad bearer token"),
    );
    responses.insert("403".into(), error("FORBIDDEN: the token may not do this"));
    responses.insert(
        "429".into(),
        error("TOO_MANY_REQUESTS: the server serves as many requests as it takes at once; come back after Retry-After seconds"),
    );
    responses.insert("500".into(), error("INTERNAL"));
    Value::Object(responses)
}

fn responses(pairs: &[(&str, Value)]) -> Value {
    common(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

fn history_params() -> Value {
    json!([
        {"name": "startTime", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "ISO 8601; entries at or after it"},
        {"name": "endTime", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "ISO 8601; entries at or before it"},
        {"name": "maxEntries", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100}},
    ])
}

/// The document: a data table (its paths and schemas as a literal).
pub fn document() -> Value {
    let mut monitor_params = history_params();
    if let Some(a) = monitor_params.as_array_mut() {
        a.push(json!({"name": "resolution", "in": "query", "schema": {"type": "string", "enum": ["raw", "5m"], "default": "raw"}}));
        a.push(json!({"name": "cluster", "in": "query", "schema": {"type": "string"}}));
    }
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Orrery DRO-DS API",
            "version": "v1",
            "description": "The REST interface of draft-zhou-crosscloud-orchestration-01 (section 6), over the same store as the Kubernetes-style API. Every error is {code, message, details}.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "paths": {
            "/api/v1/clusters": {
                "get": {"operationId": "listClusters", "summary": "Registered domains (6.2.1)",
                    "responses": responses(&[("200", ok("The domains", "ClusterList"))])},
                "post": {"operationId": "registerCluster", "summary": "Register a domain (6.2.1)",
                    "requestBody": body("RegisterCluster", "application/json"),
                    "responses": responses(&[("201", ok("Registered", "Cluster")), ("400", error("VALIDATION_FAILED")),
                        ("409", error("CLUSTER_EXISTS")), ("413", error("PAYLOAD_TOO_LARGE")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
            },
            "/api/v1/clusters/{clusterName}": {
                "delete": {"operationId": "unregisterCluster", "summary": "Unregister a domain; its namespace, Works and tokens go with it",
                    "parameters": [{"name": "clusterName", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "responses": responses(&[("200", ok("Unregistering", "Deleted")), ("404", error("CLUSTER_NOT_FOUND"))])},
            },
            "/api/v1/propagationpolicies": {
                "get": {"operationId": "listPolicies", "summary": "Policies made through this API (6.2.2)",
                    "responses": responses(&[("200", ok("The policies", "PolicyList"))])},
                "post": {"operationId": "createPolicy", "summary": "Create a propagation policy (6.2.2)",
                    "requestBody": body("Policy", "application/json"),
                    "responses": responses(&[("201", ok("Created", "PolicyView")), ("400", error("VALIDATION_FAILED")),
                        ("409", error("POLICY_CONFLICT")), ("413", error("PAYLOAD_TOO_LARGE")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
            },
            "/api/v1/propagationpolicies/{policyName}": {
                "parameters": [{"name": "policyName", "in": "path", "required": true, "schema": {"type": "string"}}],
                "get": {"operationId": "getPolicy", "responses": responses(&[("200", ok("The policy", "PolicyView")), ("404", error("POLICY_NOT_FOUND"))])},
                "patch": {"operationId": "patchPolicy", "summary": "Update with a JSON merge patch (RFC 7386)",
                    "requestBody": body("PolicyPatch", "application/merge-patch+json"),
                    "responses": responses(&[("200", ok("Updated", "PolicyView")), ("400", error("VALIDATION_FAILED")),
                        ("404", error("POLICY_NOT_FOUND")), ("409", error("CONFLICT")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
                "delete": {"operationId": "deletePolicy", "responses": responses(&[("200", ok("Deleted", "Deleted")), ("404", error("POLICY_NOT_FOUND"))])},
            },
            "/api/v1/bindings": {
                "post": {"operationId": "submitTask", "summary": "Trigger a cross-domain scheduling task (6.2.5): a fresh decision for a template a policy places, or a standalone task with requirements and priority",
                    "requestBody": body("TaskRequest", "application/json"),
                    "responses": responses(&[("202", ok("Accepted", "TaskAccepted")), ("400", error("VALIDATION_FAILED")),
                        ("404", error("BINDING_NOT_FOUND")), ("409", error("BINDING_EXISTS")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
            },
            "/api/v1/bindings/{bindingId}": {
                "delete": {"operationId": "deleteTask", "summary": "End a standalone task and free what it held",
                    "parameters": [{"name": "bindingId", "in": "path", "required": true, "schema": {"type": "string"}, "description": "<namespace>.<binding name>"}],
                    "responses": responses(&[("200", ok("Deleted", "TaskDeleted")), ("404", error("BINDING_NOT_FOUND")),
                        ("409", error("CONFLICT: the binding places a template"))])},
            },
            "/api/v1/bindings/{bindingId}/status": {
                "get": {"operationId": "taskStatus", "summary": "A scheduling task's state, domains and reasons (6.2.5)",
                    "parameters": [{"name": "bindingId", "in": "path", "required": true, "schema": {"type": "string"}, "description": "<namespace>.<binding name>"}],
                    "responses": responses(&[("200", ok("The task", "TaskStatus")), ("404", error("BINDING_NOT_FOUND"))])},
            },
            "/api/v1/metrics": {
                "put": {"operationId": "reportMetrics", "summary": "Report a domain's resource figures (6.3.1); an agent only for its own cluster",
                    "requestBody": body("MetricsReport", "application/json"),
                    "responses": responses(&[("200", ok("Accepted", "MetricsAccepted")), ("400", error("VALIDATION_FAILED")),
                        ("404", error("CLUSTER_NOT_FOUND")), ("409", error("CONFLICT")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
            },
            "/api/v1/metrics/history": {
                "post": {"operationId": "reportHistory", "summary": "Report a domain's past figures, each at its own time (up to 4,096, within the 17 days kept): they join the monitoring history and the forecasts",
                    "requestBody": body("MetricsHistory", "application/json"),
                    "responses": responses(&[("200", ok("Taken in", "HistoryAccepted")), ("400", error("VALIDATION_FAILED")),
                        ("404", error("CLUSTER_NOT_FOUND")), ("409", error("CONFLICT")), ("413", error("PAYLOAD_TOO_LARGE")),
                        ("415", error("UNSUPPORTED_MEDIA_TYPE")), ("429", error("TOO_MANY_REQUESTS"))])},
            },
            "/api/v1/metrics/events": {
                "post": {"operationId": "pushEvent", "summary": "Push a domain event (6.3.1); failures join the failure history",
                    "requestBody": body("DomainEvent", "application/json"),
                    "responses": responses(&[("201", ok("Recorded", "EventRecorded")), ("400", error("VALIDATION_FAILED")),
                        ("404", error("CLUSTER_NOT_FOUND")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
            },
            "/api/v1/sync/configs": {
                "put": {"operationId": "syncConfig", "summary": "Synchronize a domain's configuration (6.3.2)",
                    "requestBody": body("DomainConfig", "application/json"),
                    "responses": responses(&[("200", ok("The domain", "Cluster")), ("400", error("VALIDATION_FAILED")),
                        ("404", error("CLUSTER_NOT_FOUND")), ("409", error("CONFLICT")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
            },
            "/api/v1/sync/batch": {
                "post": {"operationId": "syncBatch", "summary": "Status of up to 1,000 objects, each applied atomically (6.3.2)",
                    "requestBody": body("Batch", "application/json"),
                    "responses": responses(&[("200", ok("Each item's outcome", "BatchResult")), ("400", error("VALIDATION_FAILED")),
                        ("413", error("BATCH_TOO_LARGE or PAYLOAD_TOO_LARGE")), ("415", error("UNSUPPORTED_MEDIA_TYPE"))])},
            },
            "/api/v1/monitor/realtime": {
                "get": {"operationId": "realtime", "summary": "The fleet now (6.4.1)",
                    "responses": responses(&[("200", ok("The fleet", "Realtime"))])},
            },
            "/api/v1/monitor/history": {
                "get": {"operationId": "monitorHistory", "summary": "The monitoring time series, oldest first (5.1)",
                    "parameters": monitor_params,
                    "responses": responses(&[("200", ok("Samples", "MonitorHistory")), ("400", error("VALIDATION_FAILED"))])},
            },
            "/api/v1/monitor/forecast": {
                "get": {"operationId": "monitorForecast", "summary": "Each cluster's forecast water levels per dimension and traffic, with 80 % and 95 % intervals (3.1, 5.1)",
                    "parameters": [
                        {"name": "cluster", "in": "query", "schema": {"type": "string"}, "description": "Only this cluster's forecasts."},
                        {"name": "horizon", "in": "query", "schema": {"type": "string", "pattern": "^[1-9][0-9]{0,5}[smhd]$"}, "description": "How far ahead: 90s, 30m, 6h, 1d."},
                    ],
                    "responses": responses(&[("200", ok("Forecasts", "MonitorForecast")), ("400", error("VALIDATION_FAILED")), ("404", error("CLUSTER_NOT_FOUND"))])},
            },
            "/api/v1/history/schedules": {
                "get": {"operationId": "scheduleHistory", "summary": "Scheduling decisions, newest first (6.4.2)",
                    "parameters": history_params(),
                    "responses": responses(&[("200", ok("Decisions", "ScheduleHistory")), ("400", error("VALIDATION_FAILED"))])},
            },
            "/api/v1/history/failures": {
                "get": {"operationId": "failureHistory", "summary": "Failures, newest first (6.4.2)",
                    "parameters": history_params(),
                    "responses": responses(&[("200", ok("Failures", "FailureHistory")), ("400", error("VALIDATION_FAILED"))])},
            },
            "/api/v1/openapi.json": {
                "get": {"operationId": "openapi", "summary": "This document",
                    "responses": responses(&[("200", {
                        let mut r = ok("OpenAPI 3", "Error");
                        r["content"]["application/json"]["schema"] = json!({"type": "object"});
                        r
                    })])},
            },
        },
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "PolicyPatch": {"type": "object", "additionalProperties": false, "properties": {
                    "name": {"type": "string"}, "resourceType": {"type": "string"},
                    "targetClusters": {"type": "array", "nullable": true, "items": {"type": "string"}},
                }},
                "TaskRequest": {"oneOf": [
                    {"type": "object", "required": ["resource"], "additionalProperties": false, "properties": {
                        "resource": {"$ref": "#/components/schemas/TaskResource"},
                    }},
                    {"type": "object", "required": ["task"], "additionalProperties": false, "properties": {
                        "task": {"$ref": "#/components/schemas/Task"},
                    }},
                ]},
            },
        },
    });
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.extend(generated_schemas());
    }
    doc
}

/// The request bodies' and answers' schemas, generated from the types the handlers read
/// requests into (with their limits and descriptions) and write answers from
/// ([`super::answers`]), so what the document promises is what the server parses and sends.
/// (The fuzz test checks every answer against them as well.)
fn generated_schemas() -> serde_json::Map<String, Value> {
    let mut g = schemars::generate::SchemaSettings::openapi3().into_generator();
    g.subschema_for::<super::clusters::Register>();
    g.subschema_for::<super::policies::Short>();
    g.subschema_for::<super::bindings::Resource>();
    g.subschema_for::<orrery_api::binding::Task>();
    g.subschema_for::<super::monitor::Report>();
    g.subschema_for::<super::monitor::DomainEvent>();
    g.subschema_for::<super::backfill::HistoryReport>();
    g.subschema_for::<super::monitor::Config>();
    g.subschema_for::<super::sync::Batch>();
    let mut defs = g.take_definitions(true);
    // Answers as they are written (a field left out when empty is not required), requests as
    // they are read.
    let mut g = schemars::generate::SchemaSettings::openapi3()
        .for_serialize()
        .into_generator();
    super::answers::register(&mut g);
    for (name, schema) in g.take_definitions(true) {
        if let Some(read) = defs.get(&name)
            && *read != schema
        {
            // One name, two shapes: a type both read and written, with fields the two treat
            // differently. None is, today; a test keeps it so.
            defs.insert(format!("{name}Answer"), schema);
            continue;
        }
        defs.insert(name, schema);
    }
    // What a task's requirements are given in (the Kubernetes API's own component).
    defs.insert(
        crate::schema::QUANTITY.into(),
        json!({
            "description": "A Kubernetes quantity: 500m, 2Gi, 1.5 (a string, or a number)",
            "oneOf": [{"type": "string"}, {"type": "number"}],
        }),
    );
    defs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request bodies say what their types read: no field the type lacks, the limits the
    /// attributes give, what each field is.
    #[test]
    fn request_bodies_are_their_types() {
        let doc = document();
        let s = &doc["components"]["schemas"];
        if std::env::var_os("ORRERY_PRINT_DRO_OPENAPI").is_some() {
            println!("{}", serde_json::to_string_pretty(s).unwrap());
        }
        for name in [
            "RegisterCluster",
            "Policy",
            "TaskResource",
            "Task",
            "MetricsReport",
            "DomainEvent",
            "DomainConfig",
            "Batch",
            "BatchItem",
        ] {
            assert_eq!(s[name]["additionalProperties"], json!(false), "{name}");
        }
        assert_eq!(s["RegisterCluster"]["required"], json!(["name"]));
        assert_eq!(s["RegisterCluster"]["properties"]["name"]["maxLength"], 48);
        assert_eq!(
            s["RegisterCluster"]["properties"]["capabilities"]["items"]["maxLength"],
            63
        );
        assert_eq!(s["Policy"]["required"], json!(["name", "resourceType"]));
        assert_eq!(s["MetricsReport"]["properties"]["cpuUsage"]["maximum"], 100);
        assert_eq!(
            s["MetricsReport"]["properties"]["cpuUsage"]["description"],
            "Percent of the cpu in use (0-100)."
        );
        assert_eq!(
            s["Task"]["properties"]["replicas"]["maximum"],
            orrery_api::binding::TASK_MAX_REPLICAS
        );
        assert_eq!(s["Task"]["properties"]["replicas"]["default"], 1);
        assert_eq!(
            s["Batch"]["properties"]["items"]["maxItems"],
            super::super::MAX_BATCH
        );
        assert_eq!(
            s["DomainEvent"]["properties"]["type"]["enum"],
            json!(["Normal", "Warning", "Failure"])
        );
    }

    /// The answers' components are their types, written as the handlers write them: what is
    /// left out when empty is not required, what is sent as null is nullable, and no type is
    /// described twice under one name.
    #[test]
    fn answers_are_their_types() {
        let doc = document();
        let s = doc["components"]["schemas"].as_object().unwrap();
        assert!(s.keys().all(|k| !k.ends_with("Answer")), "{:?}", s.keys());
        let required = |name: &str| -> Vec<&str> {
            s[name]["required"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default()
        };
        // Written whether or not there is a cost yet (null), left out when there is no
        // currency.
        assert!(required("Realtime").contains(&"hourlyCost"));
        assert_eq!(
            s["Realtime"]["properties"]["hourlyCost"]["nullable"],
            json!(true)
        );
        assert!(!required("Realtime").contains(&"currency"));
        assert!(!required("Realtime").contains(&"currencies"));
        // A decision says what it estimated and what a replica costs there: fields the
        // written document had missed.
        let decision = &s["ClusterDecision"]["properties"];
        assert!(decision.get("estimate").is_some() && decision.get("replicaHourly").is_some());
        assert_eq!(
            s["Error"]["properties"]["code"]["enum"]
                .as_array()
                .unwrap()
                .len(),
            ERROR_CODES.len()
        );
        assert_eq!(
            s["Cluster"]["properties"]["ready"]["$ref"],
            json!("#/components/schemas/Truth")
        );
        assert_eq!(s["Truth"]["enum"], json!(["True", "False", "Unknown"]));
        for name in [
            "Cluster",
            "ClusterList",
            "Deleted",
            "PolicyView",
            "PolicyList",
            "TaskAccepted",
            "TaskDeleted",
            "TaskStatus",
            "MetricsAccepted",
            "EventRecorded",
            "BatchResult",
            "Realtime",
            "MonitorForecast",
            "MonitorHistory",
            "ScheduleHistory",
            "FailureHistory",
        ] {
            assert!(s.contains_key(name), "{name}");
        }
    }

    #[test]
    fn every_endpoint_is_described() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/api/v1/clusters",
            "/api/v1/clusters/{clusterName}",
            "/api/v1/propagationpolicies",
            "/api/v1/propagationpolicies/{policyName}",
            "/api/v1/bindings",
            "/api/v1/bindings/{bindingId}/status",
            "/api/v1/bindings/{bindingId}",
            "/api/v1/metrics",
            "/api/v1/metrics/events",
            "/api/v1/metrics/history",
            "/api/v1/sync/configs",
            "/api/v1/sync/batch",
            "/api/v1/monitor/realtime",
            "/api/v1/history/schedules",
            "/api/v1/history/failures",
            "/api/v1/monitor/history",
            "/api/v1/monitor/forecast",
            "/api/v1/openapi.json",
        ] {
            assert!(paths.contains_key(p), "{p}");
        }
        // Every reference resolves.
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("#/components/schemas/").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '.' || *c == '-')
                .collect();
            assert!(schemas.contains_key(&name), "{name}");
        }
        // Every operation documents its success and the error body.
        for (p, item) in paths {
            for (verb, op) in item.as_object().unwrap() {
                if verb == "parameters" {
                    continue;
                }
                let r = op["responses"].as_object().unwrap();
                assert!(r.keys().any(|k| k.starts_with('2')), "{verb} {p}");
                assert!(r.contains_key("401"), "{verb} {p}");
            }
        }
    }
}
