//! Per-cluster changes to a template, and the rendering of the manifest one cluster gets.
//!
//! Override kinds, all read into one [`OverridePolicy`]:
//! - `ClusterOverridePolicy` (multicluster.io/v1alpha1), the draft's 6.2.4 shape:
//!   `overrides[{clusterSelector{names, labels}, fieldPatches[{path, value}]}]`;
//! - Karmada's `OverridePolicy` and `ClusterOverridePolicy` (policy.karmada.io/v1alpha1):
//!   `overrideRules[{targetCluster, overriders}]` with plaintext, imageOverrider,
//!   commandOverrider, argsOverrider, labelsOverrider and annotationsOverrider.
//!
//! Rendering order (deterministic, documented in docs/policies.md):
//! 1. the template, with server-managed fields stripped;
//! 2. its replica share for the cluster;
//! 3. template expansion, when the template asks for it (`multicluster.io/expand-templates`);
//! 4. override policies: Karmada ClusterOverridePolicies, then Karmada OverridePolicies, then
//!    the draft's ClusterOverridePolicies; within a kind, the less specific selector first
//!    (kind, then labels, then name; so the most specific wins), then by name. Within a Karmada
//!    rule: image, command, args, labels, annotations, then plaintext, as Karmada does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::fieldpath::FieldPath;
use crate::interpret::{Interpreter, pod_spec_pointer};
use crate::object::Object;
use crate::policy::{
    ClusterAffinity, DraftClusterSelector, FieldPatch, GROUP, KARMADA_GROUP, PolicyRef,
    ResourceSelector, Specificity, decode,
};
use crate::validation::{ErrorList, FieldError};

/// The annotation that turns on template expansion.
pub const EXPAND_ANNOTATION: &str = "multicluster.io/expand-templates";

/// What overrides and expansion may know about a cluster.
#[derive(Clone, Copy, Debug)]
pub struct ClusterView<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub provider: &'a str,
    pub region: &'a str,
    pub zones: &'a [String],
    pub properties: &'a BTreeMap<String, String>,
}

impl ClusterAffinity {
    /// Whether the cluster satisfies every condition of the affinity.
    pub fn matches(&self, c: &ClusterView<'_>) -> bool {
        self.compile().matches(c)
    }

    /// The affinity with its label selector parsed once, for matching many clusters.
    pub fn compile(&self) -> CompiledAffinity<'_> {
        CompiledAffinity {
            affinity: self,
            labels: self.label_selector.as_ref().map(|ls| ls.to_selector().ok()),
        }
    }
}

/// A [`ClusterAffinity`] ready to match many clusters.
#[derive(Clone, Debug)]
pub struct CompiledAffinity<'a> {
    affinity: &'a ClusterAffinity,
    /// `Some(None)`: a selector that does not parse (it matches nothing).
    labels: Option<Option<crate::labels::Selector>>,
}

impl CompiledAffinity<'_> {
    /// Whether the cluster satisfies every condition of the affinity.
    pub fn matches(&self, c: &ClusterView<'_>) -> bool {
        let a = self.affinity;
        if a.exclude.iter().any(|n| n == c.name) {
            return false;
        }
        if !a.cluster_names.is_empty() && !a.cluster_names.iter().any(|n| n == c.name) {
            return false;
        }
        match &self.labels {
            Some(Some(s)) if !s.matches(c.labels) => return false,
            Some(None) => return false,
            _ => {}
        }
        if let Some(fs) = &a.field_selector {
            for r in &fs.match_expressions {
                let hit = match r.key.as_str() {
                    "provider" => r.values.iter().any(|v| v == c.provider),
                    "region" => r.values.iter().any(|v| v == c.region),
                    "zone" => c.zones.iter().any(|z| r.values.iter().any(|v| v == z)),
                    _ => return false,
                };
                let ok = match r.operator.as_str() {
                    "In" => hit,
                    "NotIn" => !hit,
                    _ => false,
                };
                if !ok {
                    return false;
                }
            }
        }
        true
    }
}

impl DraftClusterSelector {
    pub fn matches(&self, c: &ClusterView<'_>) -> bool {
        (self.names.is_empty() || self.names.iter().any(|n| n == c.name))
            && self.labels.iter().all(|(k, v)| c.labels.get(k) == Some(v))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlaintextOverrider {
    /// A JSON pointer into the object (/spec/replicas).
    pub path: String,
    /// add, remove or replace.
    pub operator: String,
    /// The value added or replacing (not for remove).
    #[serde(default)]
    pub value: Value,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePredicate {
    /// A JSON pointer to the image field to change (/spec/template/spec/containers/0/image).
    pub path: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageOverrider {
    /// Which image field; absent: every container's image in the pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicate: Option<ImagePredicate>,
    /// The part of the image changed: Registry, Repository or Tag.
    pub component: String,
    /// add, remove or replace.
    pub operator: String,
    /// The new part (or what is added to it).
    #[serde(default)]
    pub value: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandArgsOverrider {
    /// The container whose command or args change.
    pub container_name: String,
    /// add (appended) or remove (each value taken out).
    pub operator: String,
    /// The arguments added or removed.
    #[serde(default)]
    pub value: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MapOverrider {
    /// add, remove or replace.
    pub operator: String,
    /// The keys and values.
    #[serde(default)]
    pub value: BTreeMap<String, String>,
}

/// Karmada's `Overriders`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Overriders {
    /// JSON-pointer changes of any field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plaintext: Vec<PlaintextOverrider>,
    /// Changes of container images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_overrider: Vec<ImageOverrider>,
    /// Changes of container commands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_overrider: Vec<CommandArgsOverrider>,
    /// Changes of container arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args_overrider: Vec<CommandArgsOverrider>,
    /// Changes of the object's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels_overrider: Vec<MapOverrider>,
    /// Changes of the object's annotations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations_overrider: Vec<MapOverrider>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleWithCluster {
    /// The clusters where the rule applies; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cluster: Option<ClusterAffinity>,
    /// The changes made there.
    pub overriders: Overriders,
}

/// Karmada's `OverrideSpec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KarmadaOverrideSpec {
    /// The templates changed; empty: every template in scope.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_selectors: Vec<ResourceSelector>,
    /// Rules applied in order, each in its clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub override_rules: Vec<RuleWithCluster>,
    /// Deprecated in Karmada in favour of `overrideRules`; still accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cluster: Option<ClusterAffinity>,
    /// Deprecated in Karmada in favour of `overrideRules`; still accepted, with `targetCluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overriders: Option<Overriders>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DraftOverride {
    /// The clusters where the patches apply.
    #[serde(default)]
    pub cluster_selector: DraftClusterSelector,
    /// The fields set there.
    pub field_patches: Vec<FieldPatch>,
}

/// The draft's `ClusterOverridePolicy` spec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DraftOverrideSpec {
    /// The templates changed.
    pub resource_selector: ResourceSelector,
    /// Patches per group of clusters, applied in order.
    pub overrides: Vec<DraftOverride>,
}

/// Which clusters a rule applies to.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleTarget {
    All,
    Affinity(ClusterAffinity),
    Draft(DraftClusterSelector),
}

impl RuleTarget {
    pub fn matches(&self, c: &ClusterView<'_>) -> bool {
        match self {
            RuleTarget::All => true,
            RuleTarget::Affinity(a) => a.matches(c),
            RuleTarget::Draft(d) => d.matches(c),
        }
    }
}

/// One change, compiled.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A JSON patch operation (Karmada plaintext).
    Patch(Value),
    /// Sets the value at a draft field path.
    Field(FieldPath, Value),
    Image(ImageOverrider),
    Command(CommandArgsOverrider),
    Args(CommandArgsOverrider),
    Labels(MapOverrider),
    Annotations(MapOverrider),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub target: RuleTarget,
    pub ops: Vec<Op>,
}

/// Every override kind, as one.
#[derive(Clone, Debug, PartialEq)]
pub struct OverridePolicy {
    pub reference: PolicyRef,
    /// Empty: every template in scope.
    pub selectors: Vec<ResourceSelector>,
    /// The namespace it is limited to (Karmada OverridePolicy), or empty.
    pub namespace: String,
    pub rules: Vec<Rule>,
    /// Kind order: Karmada cluster-scoped, Karmada namespaced, the draft's.
    pub order: u8,
}

/// The override kinds, `(group, kind, plural)`.
pub const OVERRIDE_KINDS: &[(&str, &str, &str)] = &[
    (
        KARMADA_GROUP,
        "ClusterOverridePolicy",
        "clusteroverridepolicies",
    ),
    (KARMADA_GROUP, "OverridePolicy", "overridepolicies"),
    (GROUP, "ClusterOverridePolicy", "clusteroverridepolicies"),
];

const PATCH_OPS: &[&str] = &["add", "remove", "replace"];
const IMAGE_COMPONENTS: &[&str] = &["Registry", "Repository", "Tag"];
const LIST_OPS: &[&str] = &["add", "remove"];

fn karmada_ops(o: &Overriders, path: &str, errs: &mut ErrorList) -> Vec<Op> {
    let mut ops = Vec::new();
    for (i, im) in o.image_overrider.iter().enumerate() {
        let p = format!("{path}.imageOverrider[{i}]");
        if !IMAGE_COMPONENTS.contains(&im.component.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{p}.component"),
                &im.component,
                IMAGE_COMPONENTS,
            ));
        }
        if !PATCH_OPS.contains(&im.operator.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{p}.operator"),
                &im.operator,
                PATCH_OPS,
            ));
        }
        if let Some(pr) = &im.predicate
            && !pr.path.starts_with('/')
        {
            errs.push(FieldError::invalid(
                format!("{p}.predicate.path"),
                &pr.path,
                "must be a JSON pointer starting with '/'",
            ));
        }
        ops.push(Op::Image(im.clone()));
    }
    for (name, list, wrap) in [
        (
            "commandOverrider",
            &o.command_overrider,
            Op::Command as fn(CommandArgsOverrider) -> Op,
        ),
        ("argsOverrider", &o.args_overrider, Op::Args),
    ] {
        for (i, c) in list.iter().enumerate() {
            let p = format!("{path}.{name}[{i}]");
            if c.container_name.is_empty() {
                errs.push(FieldError::required(format!("{p}.containerName"), ""));
            }
            if !LIST_OPS.contains(&c.operator.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("{p}.operator"),
                    &c.operator,
                    LIST_OPS,
                ));
            }
            ops.push(wrap(c.clone()));
        }
    }
    for (name, list, wrap) in [
        (
            "labelsOverrider",
            &o.labels_overrider,
            Op::Labels as fn(MapOverrider) -> Op,
        ),
        (
            "annotationsOverrider",
            &o.annotations_overrider,
            Op::Annotations,
        ),
    ] {
        for (i, m) in list.iter().enumerate() {
            if !PATCH_OPS.contains(&m.operator.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("{path}.{name}[{i}].operator"),
                    &m.operator,
                    PATCH_OPS,
                ));
            }
            ops.push(wrap(m.clone()));
        }
    }
    for (i, pt) in o.plaintext.iter().enumerate() {
        let p = format!("{path}.plaintext[{i}]");
        if !pt.path.starts_with('/') {
            errs.push(FieldError::invalid(
                format!("{p}.path"),
                &pt.path,
                "must be a JSON pointer starting with '/'",
            ));
        }
        if !PATCH_OPS.contains(&pt.operator.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{p}.operator"),
                &pt.operator,
                PATCH_OPS,
            ));
        }
        let mut op = serde_json::json!({"op": pt.operator, "path": pt.path});
        if pt.operator != "remove" {
            op["value"] = pt.value.clone();
        }
        ops.push(Op::Patch(op));
    }
    ops
}

/// Reads any override kind; the errors are what a create or update must be refused with.
pub fn from_object(obj: &Object) -> Result<OverridePolicy, ErrorList> {
    let group = obj.api_version.split('/').next().unwrap_or("");
    let spec = obj.spec.clone().unwrap_or(Value::Null);
    let reference = PolicyRef {
        api_version: obj.api_version.clone(),
        kind: obj.kind.clone(),
        namespace: obj.metadata.namespace.clone(),
        name: obj.name().to_string(),
    };
    let mut errs = Vec::new();
    let policy = match (group, obj.kind.as_str()) {
        (KARMADA_GROUP, "OverridePolicy" | "ClusterOverridePolicy") => {
            let s: KarmadaOverrideSpec = decode(&spec, "spec").map_err(|e| vec![e])?;
            let namespaced = obj.kind == "OverridePolicy";
            let mut selectors = Vec::new();
            for (i, sel) in s.resource_selectors.iter().enumerate() {
                let mut sel = sel.clone();
                if namespaced {
                    if !sel.namespace.is_empty() && sel.namespace != obj.metadata.namespace {
                        errs.push(FieldError::forbidden(
                            format!("spec.resourceSelectors[{i}].namespace"),
                            "an OverridePolicy selects resources in its own namespace only",
                        ));
                    }
                    sel.namespace = obj.metadata.namespace.clone();
                }
                selectors.push(sel);
            }
            let mut rules = Vec::new();
            for (i, r) in s.override_rules.iter().enumerate() {
                let ops = karmada_ops(
                    &r.overriders,
                    &format!("spec.overrideRules[{i}].overriders"),
                    &mut errs,
                );
                let target = r
                    .target_cluster
                    .clone()
                    .map(RuleTarget::Affinity)
                    .unwrap_or(RuleTarget::All);
                rules.push(Rule { target, ops });
            }
            if let Some(o) = &s.overriders {
                if !s.override_rules.is_empty() {
                    errs.push(FieldError::forbidden(
                        "spec.overriders",
                        "overriders and targetCluster cannot be used together with overrideRules",
                    ));
                }
                let ops = karmada_ops(o, "spec.overriders", &mut errs);
                let target = s
                    .target_cluster
                    .clone()
                    .map(RuleTarget::Affinity)
                    .unwrap_or(RuleTarget::All);
                rules.push(Rule { target, ops });
            }
            OverridePolicy {
                reference,
                selectors,
                namespace: if namespaced {
                    obj.metadata.namespace.clone()
                } else {
                    String::new()
                },
                rules,
                order: if namespaced { 1 } else { 0 },
            }
        }
        (GROUP, "ClusterOverridePolicy") => {
            let s: DraftOverrideSpec = decode(&spec, "spec").map_err(|e| vec![e])?;
            if s.resource_selector.api_version.is_empty() {
                errs.push(FieldError::required("spec.resourceSelector.apiVersion", ""));
            }
            if s.resource_selector.kind.is_empty() {
                errs.push(FieldError::required("spec.resourceSelector.kind", ""));
            }
            let mut rules = Vec::new();
            for (i, o) in s.overrides.iter().enumerate() {
                let mut ops = Vec::new();
                for (j, fp) in o.field_patches.iter().enumerate() {
                    match FieldPath::parse(&fp.path) {
                        Ok(p) => ops.push(Op::Field(p, fp.value.clone())),
                        Err(e) => errs.push(FieldError::invalid(
                            format!("spec.overrides[{i}].fieldPatches[{j}].path"),
                            &fp.path,
                            e,
                        )),
                    }
                }
                rules.push(Rule {
                    target: RuleTarget::Draft(o.cluster_selector.clone()),
                    ops,
                });
            }
            OverridePolicy {
                reference,
                selectors: vec![s.resource_selector],
                namespace: String::new(),
                rules,
                order: 2,
            }
        }
        _ => {
            return Err(vec![FieldError::invalid(
                "kind",
                &obj.kind,
                "not an override policy kind",
            )]);
        }
    };
    if errs.is_empty() {
        Ok(policy)
    } else {
        Err(errs)
    }
}

impl OverridePolicy {
    /// How specifically it applies to `t`, if it does (no selectors: every template in scope).
    pub fn matches(&self, t: &Object) -> Option<Specificity> {
        if !self.namespace.is_empty() && t.namespace() != self.namespace {
            return None;
        }
        if self.selectors.is_empty() {
            return Some(Specificity::Kind);
        }
        self.selectors.iter().filter_map(|s| s.matches(t)).max()
    }
}

/// The override policies that apply to `t`, in the order they are applied.
pub fn applicable<'a>(
    all: impl IntoIterator<Item = &'a OverridePolicy>,
    t: &Object,
) -> Vec<&'a OverridePolicy> {
    let mut v: Vec<(&OverridePolicy, Specificity)> = all
        .into_iter()
        .filter_map(|p| Some((p, p.matches(t)?)))
        .collect();
    v.sort_by(|(a, ah), (b, bh)| (a.order, *ah, &a.reference).cmp(&(b.order, *bh, &b.reference)));
    v.into_iter().map(|(p, _)| p).collect()
}

/// A container image split into its parts.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Image {
    registry: String,
    repository: String,
    tag: String,
    digest: String,
}

impl Image {
    fn parse(s: &str) -> Image {
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, d.to_string()),
            None => (s, String::new()),
        };
        let (registry, path) = match rest.split_once('/') {
            Some((first, p))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), p)
            }
            _ => (String::new(), rest),
        };
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) => (r.to_string(), t.to_string()),
            None => (path.to_string(), String::new()),
        };
        Image {
            registry,
            repository,
            tag,
            digest,
        }
    }

    fn render(&self) -> String {
        let mut s = String::new();
        if !self.registry.is_empty() {
            s.push_str(&self.registry);
            s.push('/');
        }
        s.push_str(&self.repository);
        if !self.tag.is_empty() {
            s.push(':');
            s.push_str(&self.tag);
        }
        if !self.digest.is_empty() {
            s.push('@');
            s.push_str(&self.digest);
        }
        s
    }

    fn change(&mut self, o: &ImageOverrider) {
        let part = match o.component.as_str() {
            "Registry" => &mut self.registry,
            "Repository" => &mut self.repository,
            _ => &mut self.tag,
        };
        match o.operator.as_str() {
            "add" if o.component != "Tag" => part.push_str(&o.value),
            "remove" => part.clear(),
            _ => *part = o.value.clone(),
        }
        if o.component == "Tag" && o.operator != "remove" {
            self.digest.clear();
        }
    }
}

fn containers_mut<'a>(obj: &'a mut Value, kind: &str, init: bool) -> Vec<&'a mut Value> {
    let Some(p) = pod_spec_pointer(kind) else {
        return vec![];
    };
    let Some(spec) = obj.pointer_mut(p).and_then(Value::as_object_mut) else {
        return vec![];
    };
    let mut out = Vec::new();
    for (k, v) in spec.iter_mut() {
        if (k == "containers" || (init && k == "initContainers"))
            && let Some(a) = v.as_array_mut()
        {
            out.extend(a.iter_mut());
        }
    }
    out
}

fn apply_op(obj: &mut Value, kind: &str, op: &Op) -> Result<(), String> {
    match op {
        Op::Patch(p) => {
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(vec![p.clone()]))
                .map_err(|e| format!("invalid plaintext override: {e}"))?;
            json_patch::patch(obj, &patch)
                .map_err(|e| format!("plaintext override {}: {e}", p["path"]))
        }
        Op::Field(path, v) => path
            .set(obj, v.clone())
            .map_err(|e| format!("field patch {path}: {e}")),
        Op::Image(im) => {
            if let Some(pr) = &im.predicate {
                let slot = obj
                    .pointer_mut(&pr.path)
                    .ok_or_else(|| format!("image override: {} does not exist", pr.path))?;
                let cur = slot
                    .as_str()
                    .ok_or_else(|| format!("image override: {} is not a string", pr.path))?;
                let mut img = Image::parse(cur);
                img.change(im);
                *slot = Value::from(img.render());
            } else {
                for c in containers_mut(obj, kind, true) {
                    if let Some(cur) = c.get("image").and_then(Value::as_str) {
                        let mut img = Image::parse(cur);
                        img.change(im);
                        c["image"] = Value::from(img.render());
                    }
                }
            }
            Ok(())
        }
        Op::Command(c) | Op::Args(c) => {
            let field = if matches!(op, Op::Command(_)) {
                "command"
            } else {
                "args"
            };
            for ctr in containers_mut(obj, kind, true) {
                if ctr.get("name").and_then(Value::as_str) != Some(c.container_name.as_str()) {
                    continue;
                }
                let Some(m) = ctr.as_object_mut() else {
                    continue;
                };
                let list = m.entry(field).or_insert_with(|| Value::Array(vec![]));
                let Some(a) = list.as_array_mut() else {
                    return Err(format!("{field} of {} is not a list", c.container_name));
                };
                if c.operator == "add" {
                    a.extend(c.value.iter().map(|v| Value::from(v.as_str())));
                } else {
                    a.retain(|x| !c.value.iter().any(|v| x.as_str() == Some(v)));
                }
            }
            Ok(())
        }
        Op::Labels(m) | Op::Annotations(m) => {
            let field = if matches!(op, Op::Labels(_)) {
                "labels"
            } else {
                "annotations"
            };
            let meta = obj
                .as_object_mut()
                .ok_or("the manifest is not an object")?
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            let map = meta
                .as_object_mut()
                .ok_or("metadata is not an object")?
                .entry(field)
                .or_insert_with(|| Value::Object(Map::new()));
            let map = map
                .as_object_mut()
                .ok_or_else(|| format!("metadata.{field} is not an object"))?;
            for (k, v) in &m.value {
                match m.operator.as_str() {
                    "add" => {
                        map.entry(k.clone())
                            .or_insert_with(|| Value::from(v.as_str()));
                    }
                    "replace" => {
                        if map.contains_key(k) {
                            map.insert(k.clone(), Value::from(v.as_str()));
                        }
                    }
                    _ => {
                        map.remove(k);
                    }
                }
            }
            Ok(())
        }
    }
}

/// Expands `{{ .clusterName }}`, `{{ .labels.KEY }}` and `{{ .properties.NAME }}` in every
/// string of `v`; an unknown variable or a missing label or property is an error.
pub fn expand(v: &mut Value, c: &ClusterView<'_>) -> Result<(), String> {
    match v {
        Value::String(s) if s.contains("{{") => {
            *s = expand_str(s, c)?;
            Ok(())
        }
        Value::Array(a) => a.iter_mut().try_for_each(|x| expand(x, c)),
        Value::Object(m) => m.values_mut().try_for_each(|x| expand(x, c)),
        _ => Ok(()),
    }
}

fn expand_str(s: &str, c: &ClusterView<'_>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unclosed '{{{{' in {s:?}"))?;
        let var = after[..end].trim();
        let value = if var == ".clusterName" {
            c.name.to_string()
        } else if let Some(k) = var.strip_prefix(".labels.") {
            c.labels
                .get(k)
                .cloned()
                .ok_or_else(|| format!("cluster {} has no label {k:?}", c.name))?
        } else if let Some(k) = var.strip_prefix(".properties.") {
            c.properties
                .get(k)
                .cloned()
                .ok_or_else(|| format!("cluster {} has no property {k:?}", c.name))?
        } else {
            return Err(format!(
                "unknown template variable {var:?} (known: .clusterName, .labels.KEY, .properties.NAME)"
            ));
        };
        out.push_str(&value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The template as a member should receive it: what the control plane's server set is gone.
pub fn strip(t: &Object) -> Value {
    let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.remove("status");
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in [
                "uid",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
                "ownerReferences",
                "finalizers",
                "generateName",
            ] {
                meta.remove(k);
            }
            if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
                a.remove(crate::binding::POLICY_ANNOTATION);
                if a.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
        let kind = t.kind.as_str();
        if let Some(spec) = m.get_mut("spec").and_then(Value::as_object_mut) {
            match kind {
                "Service" => {
                    if spec.get("clusterIP").and_then(Value::as_str) != Some("None") {
                        spec.remove("clusterIP");
                        spec.remove("clusterIPs");
                    }
                    spec.remove("healthCheckNodePort");
                }
                "PersistentVolumeClaim" => {
                    spec.remove("volumeName");
                }
                "Pod" => {
                    spec.remove("nodeName");
                }
                _ => {}
            }
        }
    }
    v
}

/// One cluster's manifest of a template: stripped, its replica share, expanded, overridden.
pub fn render(
    t: &Object,
    interp: Interpreter<'_>,
    replicas: Option<i64>,
    cluster: &ClusterView<'_>,
    overrides: &[&OverridePolicy],
) -> Result<Value, String> {
    let mut v = strip(t);
    if let Some(n) = replicas {
        interp.set_replicas(&mut v, n);
    }
    if t.metadata
        .annotations
        .get(EXPAND_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        expand(&mut v, cluster)?;
        if let Some(a) = v
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            a.remove(EXPAND_ANNOTATION);
        }
    }
    for p in overrides {
        for r in &p.rules {
            if !r.target.matches(cluster) {
                continue;
            }
            for op in &r.ops {
                apply_op(&mut v, &t.kind, op).map_err(|e| format!("{}: {e}", p.reference))?;
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        serde_json::from_value(v).unwrap()
    }

    fn deploy() -> Object {
        obj(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "ai-model", "namespace": "default", "uid": "u", "resourceVersion": "9",
                "generation": 2, "managedFields": [{}], "labels": {"app": "ai"}},
            "spec": {"replicas": 4, "template": {"spec": {
                "containers": [{"name": "main", "image": "docker.io/library/nginx:1.25", "command": ["nginx"]}],
                "initContainers": [{"name": "init", "image": "busybox"}]}}},
            "status": {"replicas": 4}}))
    }

    struct C {
        name: String,
        labels: BTreeMap<String, String>,
        props: BTreeMap<String, String>,
        zones: Vec<String>,
    }

    impl C {
        fn new(name: &str, labels: &[(&str, &str)]) -> C {
            C {
                name: name.into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                props: [("tier".to_string(), "gold".to_string())].into(),
                zones: vec!["z1".into()],
            }
        }
        fn view(&self) -> ClusterView<'_> {
            ClusterView {
                name: &self.name,
                labels: &self.labels,
                provider: "aws",
                region: "us-east-1",
                zones: &self.zones,
                properties: &self.props,
            }
        }
    }

    #[test]
    fn draft_example_patches_one_cluster() {
        let cop = from_object(&obj(json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "ClusterOverridePolicy",
            "metadata": {"name": "gpu-override"},
            "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ai-model", "namespace": "default"},
                "overrides": [{"clusterSelector": {"names": ["gpu-cluster"]},
                    "fieldPatches": [{"path": "spec.template.spec.containers[0].resources.limits", "value": {"nvidia.com/gpu": 2}}]}]}})))
        .unwrap();
        let t = deploy();
        let ops = applicable([&cop], &t);
        assert_eq!(ops.len(), 1);
        let gpu = C::new("gpu-cluster", &[]);
        let cpu = C::new("cpu-cluster", &[]);
        let on_gpu = render(&t, Interpreter::BuiltIn, Some(1), &gpu.view(), &ops).unwrap();
        assert_eq!(
            on_gpu["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            2
        );
        assert_eq!(on_gpu["spec"]["replicas"], 1);
        let on_cpu = render(&t, Interpreter::BuiltIn, Some(3), &cpu.view(), &ops).unwrap();
        assert!(
            on_cpu["spec"]["template"]["spec"]["containers"][0]
                .get("resources")
                .is_none()
        );
        // Server-managed fields are gone.
        for f in ["uid", "resourceVersion", "generation", "managedFields"] {
            assert!(on_cpu["metadata"].get(f).is_none(), "{f}");
        }
        assert!(on_cpu.get("status").is_none());
        let bad = obj(
            json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "ClusterOverridePolicy", "metadata": {"name": "x"},
            "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "Deployment"},
                "overrides": [{"clusterSelector": {}, "fieldPatches": [{"path": "spec..x", "value": 1}]}]}}),
        );
        assert_eq!(
            from_object(&bad).unwrap_err()[0].field,
            "spec.overrides[0].fieldPatches[0].path"
        );
    }

    #[test]
    fn karmada_overriders() {
        let op = from_object(&obj(json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "OverridePolicy",
            "metadata": {"name": "example", "namespace": "default"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "ai-model"}],
                "overrideRules": [
                    {"targetCluster": {"clusterNames": ["member1"]}, "overriders": {
                        "imageOverrider": [{"component": "Registry", "operator": "replace", "value": "registry.cn"},
                                           {"component": "Tag", "operator": "replace", "value": "1.26"}],
                        "commandOverrider": [{"containerName": "main", "operator": "add", "value": ["-g", "daemon off;"]}],
                        "argsOverrider": [{"containerName": "main", "operator": "add", "value": ["--v=2"]}],
                        "labelsOverrider": [{"operator": "add", "value": {"region": "cn", "app": "ignored"}}],
                        "annotationsOverrider": [{"operator": "add", "value": {"note": "x"}}],
                        "plaintext": [{"path": "/spec/replicas", "operator": "replace", "value": 7}]}},
                    {"targetCluster": {"labelSelector": {"matchLabels": {"env": "edge"}}}, "overriders": {
                        "imageOverrider": [{"predicate": {"path": "/spec/template/spec/containers/0/image"}, "component": "Repository", "operator": "add", "value": "-edge"}],
                        "labelsOverrider": [{"operator": "remove", "value": {"app": ""}}]}}
                ]}})))
        .unwrap();
        let t = deploy();
        let ops = applicable([&op], &t);
        let m1 = C::new("member1", &[]);
        let v = render(&t, Interpreter::BuiltIn, Some(2), &m1.view(), &ops).unwrap();
        let c = &v["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "registry.cn/library/nginx:1.26");
        assert_eq!(
            v["spec"]["template"]["spec"]["initContainers"][0]["image"],
            "registry.cn/busybox:1.26"
        );
        assert_eq!(c["command"], json!(["nginx", "-g", "daemon off;"]));
        assert_eq!(c["args"], json!(["--v=2"]));
        assert_eq!(
            v["metadata"]["labels"],
            json!({"app": "ai", "region": "cn"})
        );
        assert_eq!(v["metadata"]["annotations"]["note"], "x");
        assert_eq!(
            v["spec"]["replicas"], 7,
            "plaintext comes after the replica share"
        );
        let edge = C::new("e1", &[("env", "edge")]);
        let v = render(&t, Interpreter::BuiltIn, Some(2), &edge.view(), &ops).unwrap();
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["image"],
            "docker.io/library/nginx-edge:1.25"
        );
        assert!(v["metadata"].get("labels").unwrap().get("app").is_none());
        // A plaintext patch of a missing path fails this cluster only, naming the policy.
        let broken = from_object(&obj(json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterOverridePolicy",
            "metadata": {"name": "broken"}, "spec": {"overrideRules": [{"overriders": {"plaintext": [{"path": "/spec/nope/deeper", "operator": "replace", "value": 1}]}}]}})))
        .unwrap();
        let err = render(&t, Interpreter::BuiltIn, None, &m1.view(), &[&broken]).unwrap_err();
        assert!(err.contains("ClusterOverridePolicy broken"), "{err}");
        // Bad input is refused with the field named.
        for (spec, field) in [
            (
                json!({"overrideRules": [{"overriders": {"plaintext": [{"path": "spec", "operator": "add", "value": 1}]}}]}),
                "spec.overrideRules[0].overriders.plaintext[0].path",
            ),
            (
                json!({"overrideRules": [{"overriders": {"imageOverrider": [{"component": "Digest", "operator": "add"}]}}]}),
                "spec.overrideRules[0].overriders.imageOverrider[0].component",
            ),
            (
                json!({"overrideRules": [{"overriders": {"fieldOverrider": []}}]}),
                "spec.overrideRules[0].overriders.fieldOverrider",
            ),
        ] {
            let o = obj(
                json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "OverridePolicy", "metadata": {"name": "b", "namespace": "default"}, "spec": spec}),
            );
            let errs = from_object(&o).unwrap_err();
            assert!(errs.iter().any(|e| e.field == field), "{errs:?}");
        }
    }

    #[test]
    fn order_is_kind_then_specificity_then_name() {
        let mk = |api: &str, kind: &str, ns: &str, name: &str, sel: Value| {
            from_object(&obj(json!({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": ns},
                "spec": {"resourceSelectors": [sel], "overrideRules": [{"overriders": {"labelsOverrider": [{"operator": "add", "value": {"x": name}}]}}]}}))).unwrap()
        };
        let k = "policy.karmada.io/v1alpha1";
        let named = mk(
            k,
            "OverridePolicy",
            "default",
            "a",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "ai-model"}),
        );
        let kind = mk(
            k,
            "OverridePolicy",
            "default",
            "b",
            json!({"apiVersion": "apps/v1", "kind": "Deployment"}),
        );
        let cluster = mk(
            k,
            "ClusterOverridePolicy",
            "",
            "c",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "ai-model"}),
        );
        let other_ns = mk(
            k,
            "OverridePolicy",
            "other",
            "d",
            json!({"apiVersion": "apps/v1", "kind": "Deployment"}),
        );
        let t = deploy();
        let order: Vec<&str> = applicable([&named, &kind, &cluster, &other_ns], &t)
            .iter()
            .map(|p| p.reference.name.as_str())
            .collect();
        assert_eq!(order, ["c", "b", "a"]);
    }

    #[test]
    fn templates_expand_per_cluster() {
        let mut t = deploy();
        t.metadata
            .annotations
            .insert(EXPAND_ANNOTATION.into(), "true".into());
        t.spec.as_mut().unwrap()["template"]["spec"]["containers"][0]["env"] = json!([{"name": "WHERE", "value": "{{ .clusterName }}/{{.labels.env}}/{{ .properties.tier }}"}]);
        let c = C::new("m1", &[("env", "prod")]);
        let v = render(&t, Interpreter::BuiltIn, None, &c.view(), &[]).unwrap();
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"],
            "m1/prod/gold"
        );
        assert!(
            v["metadata"]
                .get("annotations")
                .is_none_or(|a| a.get(EXPAND_ANNOTATION).is_none())
        );
        let bare = C::new("m2", &[]);
        let err = render(&t, Interpreter::BuiltIn, None, &bare.view(), &[]).unwrap_err();
        assert!(err.contains("no label \"env\""), "{err}");
        let mut t2 = t.clone();
        t2.spec.as_mut().unwrap()["x"] = json!("{{ .secret }}");
        assert!(
            render(&t2, Interpreter::BuiltIn, None, &c.view(), &[])
                .unwrap_err()
                .contains("unknown template variable")
        );
        // Without the annotation, braces are left alone.
        let mut plain = deploy();
        plain.spec.as_mut().unwrap()["x"] = json!("{{ .clusterName }}");
        assert_eq!(
            render(&plain, Interpreter::BuiltIn, None, &c.view(), &[]).unwrap()["spec"]["x"],
            "{{ .clusterName }}"
        );
    }

    #[test]
    fn affinity_and_services() {
        let c = C::new("m1", &[("env", "prod")]);
        let aff: ClusterAffinity = serde_json::from_value(json!({"fieldSelector": {"matchExpressions": [{"key": "region", "operator": "In", "values": ["us-east-1"]}]}, "exclude": ["m9"]})).unwrap();
        assert!(aff.matches(&c.view()));
        let aff: ClusterAffinity = serde_json::from_value(json!({"fieldSelector": {"matchExpressions": [{"key": "provider", "operator": "NotIn", "values": ["aws"]}]}})).unwrap();
        assert!(!aff.matches(&c.view()));
        let aff: ClusterAffinity =
            serde_json::from_value(json!({"clusterNames": ["m1"], "exclude": ["m1"]})).unwrap();
        assert!(!aff.matches(&c.view()));
        let svc = obj(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"], "ports": [{"port": 80}]}}),
        );
        let v = strip(&svc);
        assert!(v["spec"].get("clusterIP").is_none() && v["spec"].get("clusterIPs").is_none());
        let headless = obj(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"clusterIP": "None"}}),
        );
        assert_eq!(strip(&headless)["spec"]["clusterIP"], "None");
    }
}
