//! An operation's options, typed: what Kubernetes takes in a request's query (`dryRun`,
//! `fieldManager`, selectors, `limit`...), parsed once by the surface that received them.
//! Only the options a verb reads are parsed for it, as kube-apiserver decodes a verb's own
//! options type: a `GET` with `?dryRun=nonsense` is served, a `POST` with it is refused.
//! Selectors stay text here: what a field selector may name depends on the kind, and the
//! operation checks it.

use crate::error::{ApiError, ApiResult};
use crate::http::{Query, Representation};
use crate::table::IncludeObject;

use super::Verb;

/// How undeclared and duplicate fields are treated (`?fieldValidation=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    fn parse(v: Option<&str>) -> ApiResult<Self> {
        match v {
            None | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation must be one of \"Ignore\", \"Warn\" or \"Strict\", got {other:?}"
            ))),
        }
    }
}

/// Whether the request only pretends to write (`?dryRun=All`).
fn dry_run(v: Option<&str>) -> ApiResult<bool> {
    match v {
        None => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun must be \"All\", got {other:?}"
        ))),
    }
}

/// The options of one operation. A field a verb does not read keeps its default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Writes and deletes: validate and answer, store nothing.
    pub dry_run: bool,
    /// Writes: undeclared and duplicate fields.
    pub field_validation: FieldValidation,
    /// Writes: the field manager named (required for server-side apply).
    pub field_manager: Option<String>,
    /// Server-side apply: take fields other managers own.
    pub force: bool,
    /// Deletes: `Orphan`, `Background` or `Foreground`, as given (checked with the body's).
    pub propagation_policy: Option<String>,
    /// Deletes: the legacy spelling of `propagationPolicy=Orphan`.
    pub orphan_dependents: bool,
    /// Lists, watches, collection deletes.
    pub list: ListQuery,
    /// Tables: what each row carries besides its cells.
    pub include_object: IncludeObject,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            dry_run: false,
            field_validation: FieldValidation::default(),
            field_manager: None,
            force: false,
            propagation_policy: None,
            orphan_dependents: false,
            list: ListQuery::default(),
            include_object: IncludeObject::Metadata,
        }
    }
}

/// What a list or a watch is asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// Lists: at most this many objects, then a continue token.
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    /// Watches.
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    /// Watches: `None` when not given (the default depends on the resource version).
    pub send_initial_events: Option<bool>,
}

impl Options {
    /// The options `verb` reads, from a request's query.
    pub fn parse(verb: Verb, representation: Representation, q: &Query) -> ApiResult<Options> {
        let mut o = Options::default();
        let text = |k: &str| q.get(k).map(str::to_string);
        if matches!(verb, Verb::List | Verb::Watch | Verb::DeleteCollection) {
            o.list.label_selector = text("labelSelector");
            o.list.field_selector = text("fieldSelector");
        }
        match verb {
            Verb::List => {
                o.list.limit = q.number::<usize>("limit")?;
                o.list.continue_token = text("continue");
                o.list.resource_version = text("resourceVersion");
                o.list.resource_version_match = text("resourceVersionMatch");
            }
            Verb::Watch => {
                o.list.allow_watch_bookmarks = q.flag("allowWatchBookmarks")?;
                o.list.send_initial_events =
                    q.get("sendInitialEvents").map(|v| v == "true" || v == "1");
                o.list.resource_version = text("resourceVersion");
                o.list.resource_version_match = text("resourceVersionMatch");
                o.list.timeout_seconds = q.number::<u64>("timeoutSeconds")?;
            }
            Verb::Create | Verb::Update | Verb::Patch => {
                o.field_validation = FieldValidation::parse(q.get("fieldValidation"))?;
                o.dry_run = dry_run(q.get("dryRun"))?;
                o.field_manager = text("fieldManager");
                if verb == Verb::Patch {
                    o.force = q.flag("force")?;
                }
            }
            Verb::Delete | Verb::DeleteCollection => {
                o.propagation_policy = text("propagationPolicy");
                o.orphan_dependents = q.flag("orphanDependents")?;
                o.dry_run = dry_run(q.get("dryRun"))?;
            }
            Verb::Get => {}
        }
        if representation == Representation::Table {
            o.include_object =
                IncludeObject::parse(q.get("includeObject")).map_err(ApiError::bad_request)?;
        }
        Ok(o)
    }

    /// A list or watch of the objects `label_selector` matches.
    pub fn selecting(label_selector: Option<&str>) -> Options {
        let mut o = Options::default();
        o.list.label_selector = label_selector.map(str::to_string);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(verb: Verb, q: &str) -> ApiResult<Options> {
        Options::parse(verb, Representation::Json, &Query::parse(Some(q)))
    }

    #[test]
    fn a_verb_reads_its_own_options_only() {
        // A read is not refused for a write's option, nor a write for a list's.
        assert_eq!(
            parse(Verb::Get, "dryRun=nonsense").unwrap(),
            Options::default()
        );
        assert_eq!(parse(Verb::Create, "limit=x").unwrap(), Options::default());
        assert!(parse(Verb::Create, "dryRun=nonsense").is_err());
        assert!(parse(Verb::Delete, "dryRun=nonsense").is_err());
        assert!(parse(Verb::List, "limit=x").is_err());
        assert!(parse(Verb::Watch, "timeoutSeconds=-1").is_err());
        // force is an apply's, and apply is a patch.
        assert!(parse(Verb::Patch, "force=maybe").is_err());
        assert!(!parse(Verb::Update, "force=maybe").unwrap().force);
    }

    #[test]
    fn options_are_typed() {
        let o = parse(
            Verb::Patch,
            "dryRun=All&fieldValidation=Strict&fieldManager=me&force=true",
        )
        .unwrap();
        assert!(o.dry_run && o.force);
        assert_eq!(o.field_validation, FieldValidation::Strict);
        assert_eq!(o.field_manager.as_deref(), Some("me"));
        let o = parse(
            Verb::Watch,
            "labelSelector=a%3Db&allowWatchBookmarks=1&sendInitialEvents=true&resourceVersion=7",
        )
        .unwrap();
        assert_eq!(o.list.label_selector.as_deref(), Some("a=b"));
        assert!(o.list.allow_watch_bookmarks);
        assert_eq!(o.list.send_initial_events, Some(true));
        assert_eq!(o.list.resource_version.as_deref(), Some("7"));
        let o = parse(
            Verb::Delete,
            "orphanDependents=true&propagationPolicy=Foreground",
        )
        .unwrap();
        assert!(o.orphan_dependents);
        assert_eq!(o.propagation_policy.as_deref(), Some("Foreground"));
        // An empty value is no value, as before.
        assert_eq!(
            parse(Verb::List, "labelSelector=")
                .unwrap()
                .list
                .label_selector,
            None
        );
    }

    #[test]
    fn include_object_is_a_tables_option() {
        let q = Query::parse(Some("includeObject=Everything"));
        assert!(Options::parse(Verb::Get, Representation::Table, &q).is_err());
        assert!(Options::parse(Verb::Get, Representation::Json, &q).is_ok());
        let q = Query::parse(Some("includeObject=Object"));
        let o = Options::parse(Verb::List, Representation::Table, &q).unwrap();
        assert_eq!(o.include_object, IncludeObject::Object);
    }
}
