//! Every operation on the edge cases Karmada's documentation and code name (our own fixtures).

use super::*;
use serde_json::{Value, json};

fn vm() -> Vm {
    Vm::default()
}

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "annotations": {}},
        "spec": {
            "replicas": 3,
            "template": {"spec": {
                "nodeSelector": {"zone": "a"},
                "serviceAccountName": "web",
                "containers": [
                    {"name": "a", "resources": {"limits": {"cpu": "100m", "memory": "100M"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "1.2", "memory": "1.2G"}}}
                ]
            }}
        },
        "status": {}
    })
}

#[test]
fn get_replicas_reads_a_number_and_what_one_replica_requires() {
    let script = r#"
local kube = require("kube")
function GetReplicas(desiredObj)
  replica = desiredObj.spec.replicas
  requires = { nodeClaim = { nodeSelector = desiredObj.spec.template.spec.nodeSelector,
                             tolerations = desiredObj.spec.template.spec.tolerations },
               resourceRequest = {} }
  for i = 1, #desiredObj.spec.template.spec.containers do
    local c = desiredObj.spec.template.spec.containers[i]
    requires.resourceRequest.cpu = kube.resourceAdd(requires.resourceRequest.cpu, c.resources.limits.cpu)
    requires.resourceRequest.memory = kube.resourceAdd(requires.resourceRequest.memory, c.resources.limits.memory)
  end
  return replica, requires
end"#;
    let (n, req) = vm().get_replicas(script, &deployment()).unwrap();
    assert_eq!(n, 3);
    let req = serde_json::to_value(req.unwrap()).unwrap();
    assert_eq!(
        req,
        json!({"nodeClaim": {"nodeSelector": {"zone": "a"}}, "resourceRequest": {"cpu": "1300m", "memory": "1300M"}})
    );
    // Karmada's helper gives the same for the pod template.
    assert_eq!(
        kube::requirements(&deployment()["spec"]["template"]).unwrap()["resourceRequest"],
        json!({"cpu": "1300m", "memory": "1300000000"})
    );
}

#[test]
fn get_replicas_is_strict_about_its_results() {
    let run = |body: &str| {
        vm().get_replicas(
            &format!("function GetReplicas(o) {body} end"),
            &deployment(),
        )
    };
    assert_eq!(
        run("return 2.9").unwrap(),
        (2, None),
        "truncated, as int32(float64)"
    );
    assert_eq!(run("return -1.5").unwrap().0, -1);
    assert_eq!(run("return 0").unwrap(), (0, None));
    assert_eq!(
        run("return nil").unwrap_err().message,
        "result type 0 is not number"
    );
    assert_eq!(
        run("return '3'").unwrap_err().message,
        "result type 3 is not number"
    );
    assert_eq!(
        run("return 1, 'x'").unwrap_err().message,
        "expect the returned requires type is table but got string"
    );
    // An empty table is empty requirements; an empty nodeClaim disappears.
    assert_eq!(
        run("return 1, {}").unwrap(),
        (1, Some(ReplicaRequirements::default()))
    );
    let (_, r) =
        run("return 1, {nodeClaim = {}, resourceRequest = {cpu = 0.5}, namespace = 'x'}").unwrap();
    let r = r.unwrap();
    assert_eq!(r.node_claim, None);
    assert_eq!(r.resource_request["cpu"].to_string(), "500m");
    assert_eq!(r.namespace, "x");
    let e = vm()
        .get_replicas("function Other() end", &deployment())
        .unwrap_err();
    assert_eq!(e.message, "not found function GetReplicas");
    let e = vm()
        .get_replicas("GetReplicas = 1", &deployment())
        .unwrap_err();
    assert_eq!(e.message, "GetReplicas is not a function: number");
    let e = vm()
        .get_replicas(
            "function GetReplicas(o) return o.spec.nothing.x end",
            &deployment(),
        )
        .unwrap_err();
    assert!(e.message.contains("attempt to index"), "{e}");
    assert!(!e.message.contains("traceback"), "one line: {e}");
}

#[test]
fn components_are_a_list_or_nothing() {
    let run = |body: &str| {
        vm().get_components(
            &format!("local kube = require('kube')\nfunction GetComponents(o) {body} end"),
            &deployment(),
        )
    };
    assert_eq!(run("return nil").unwrap(), None);
    assert_eq!(run("return {}").unwrap(), Some(Vec::new()));
    let got = run(
        "return {{name = 'master', replicas = o.spec.replicas, replicaRequirements = kube.accuratePodRequirements(o.spec.template)},
                 {name = 'worker', replicas = 2}}",
    )
    .unwrap()
    .unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].name.as_str(), got[0].replicas), ("master", 3));
    let req = got[0].replica_requirements.as_ref().unwrap();
    assert_eq!(req.resource_request["cpu"].to_string(), "1300m");
    assert_eq!(req.node_claim.as_ref().unwrap().node_selector["zone"], "a");
    assert_eq!(got[1].replica_requirements, None);
    let e = run("return {{name = 'a', replicas = 1.5}}").unwrap_err();
    assert!(
        e.message
            .starts_with("failed to convert lua table for components"),
        "{e}"
    );
    assert_eq!(
        run("return 1").unwrap_err().message,
        "expected result type 'table' or 'nil' from GetComponents, but got 'number'"
    );
    // One table in two places is refused, as Karmada's encoder refuses it.
    let e = run("local s = {zone = 'a'}; return {{name = 'a', replicas = 1, replicaRequirements = {nodeClaim = {nodeSelector = s}}},
                 {name = 'b', replicas = 1, replicaRequirements = {nodeClaim = {nodeSelector = s}}}}").unwrap_err();
    assert!(
        e.message
            .contains("cannot encode recursively nested tables to JSON"),
        "{e}"
    );
}

#[test]
fn revise_and_retain_keep_the_empty_fields_their_objects_had() {
    let revised = vm()
        .revise_replica(
            "function ReviseReplica(obj, desiredReplica) obj.spec.replicas = desiredReplica return obj end",
            &deployment(),
            2,
        )
        .unwrap();
    assert_eq!(revised["spec"]["replicas"], json!(2));
    assert_eq!(revised["status"], json!({}), "from the original");
    assert_eq!(revised["metadata"]["annotations"], json!({}));
    let e = vm()
        .revise_replica(
            "function ReviseReplica(obj, n) return {spec = {}} end",
            &deployment(),
            2,
        )
        .unwrap_err();
    assert!(e.message.starts_with("Object 'Kind' is missing in"), "{e}");
    let e = vm()
        .revise_replica("function ReviseReplica(obj, n) end", &deployment(), 2)
        .unwrap_err();
    assert_eq!(
        e.message,
        "expect the returned requires type is table but got nil"
    );

    let mut observed = deployment();
    observed["metadata"]["annotations"] = json!({"cluster": "member1"});
    observed["spec"]["paused"] = json!(true);
    let retained = vm()
        .retain(
            "function Retain(desiredObj, observedObj)
               desiredObj.metadata.annotations.cluster = observedObj.metadata.annotations.cluster
               desiredObj.spec.paused = observedObj.spec.paused
               desiredObj.spec.extra = {}
               return desiredObj
             end",
            &deployment(),
            &observed,
        )
        .unwrap();
    assert_eq!(
        retained["metadata"]["annotations"],
        json!({"cluster": "member1"})
    );
    assert_eq!(retained["spec"]["paused"], json!(true));
    assert_eq!(retained["status"], json!({}));
    assert!(
        retained["spec"].get("extra").is_none(),
        "an empty table neither object had goes"
    );
}

#[test]
fn status_is_reflected_and_aggregated() {
    let observed = json!({"kind": "Deployment", "status": {"readyReplicas": 3, "conditions": []}});
    let reflected = vm()
        .reflect_status("function ReflectStatus(o) return o.status end", &observed)
        .unwrap();
    assert_eq!(reflected, json!({"readyReplicas": 3}), "an empty list goes");
    let e = vm()
        .reflect_status("function ReflectStatus(o) return nil end", &observed)
        .unwrap_err();
    assert_eq!(
        e.message,
        "expect the returned replica type is table but got nil"
    );

    let script = "function AggregateStatus(desiredObj, statusItems)
        if statusItems == nil then return desiredObj end
        local ready = 0
        for i = 1, #statusItems do
          if statusItems[i].status ~= nil and statusItems[i].status.readyReplicas ~= nil then
            ready = ready + statusItems[i].status.readyReplicas
          end
        end
        desiredObj.status = {readyReplicas = ready}
        return desiredObj
      end";
    let items = [
        json!({"clusterName": "m1", "status": {"readyReplicas": 2}, "applied": true, "health": "Healthy"}),
        json!({"clusterName": "m2", "status": {"readyReplicas": 3}, "applied": true}),
        json!({"clusterName": "m3"}),
    ];
    let agg = vm()
        .aggregate_status(script, &deployment(), Some(&items))
        .unwrap();
    assert_eq!(agg["status"], json!({"readyReplicas": 5}));
    // No items: nil to the script; empty tables of the result go (no references).
    let agg = vm().aggregate_status(script, &deployment(), None).unwrap();
    assert!(
        agg.get("status").is_none() && agg["metadata"].get("annotations").is_none(),
        "{agg}"
    );
    // An empty list is a table: the script goes on and sums nothing.
    let agg = vm()
        .aggregate_status(script, &deployment(), Some(&[]))
        .unwrap();
    assert_eq!(agg["status"], json!({"readyReplicas": 0}));
}

#[test]
fn health_is_a_boolean_and_nothing_else() {
    let run = |body: &str| {
        vm().interpret_health(
            &format!("function InterpretHealth(o) {body} end"),
            &json!({"kind": "X", "status": {"readyReplicas": 1}}),
        )
    };
    assert_eq!(run("return o.status.readyReplicas == 1"), Ok(true));
    assert_eq!(run("return false"), Ok(false));
    // Karmada's own doc example falls through with nothing: an error, not false.
    assert_eq!(
        run("if o.status.readyReplicas == 2 then return true end")
            .unwrap_err()
            .message,
        "result type 0 is not bool"
    );
    assert_eq!(
        run("return 1").unwrap_err().message,
        "result type 2 is not bool"
    );
}

#[test]
fn dependencies_of_every_script_are_checked_merged_and_sorted() {
    let pods = "local kube = require('kube')
      function GetDependencies(o) return kube.getPodDependencies(o.spec.template, o.metadata.namespace) end";
    let extra = "function GetDependencies(o)
        return {{apiVersion = 'v1', kind = 'ConfigMap', namespace = o.metadata.namespace, name = 'cfg'},
                {apiVersion = 'v1', kind = 'ServiceAccount', namespace = 'shop', name = 'web'},
                {apiVersion = 'v1', kind = 'Secret', namespace = 'shop', labelSelector = {matchLabels = {app = 'web'}}}}
      end";
    let deps = vm()
        .get_dependencies(&[pods, extra], &deployment())
        .unwrap();
    let names: Vec<String> = deps
        .iter()
        .map(|d| format!("{}/{}", d.kind, d.name))
        .collect();
    assert_eq!(names, ["ConfigMap/cfg", "Secret/", "ServiceAccount/web"]);
    // A pod template that names nothing: the helper's nil is not a table.
    let mut bare = deployment();
    bare["spec"]["template"] = json!({"spec": {"containers": [{"name": "a"}]}});
    let e = vm().get_dependencies(&[pods], &bare).unwrap_err();
    assert_eq!(
        e.message,
        "expect the returned requires type is table but got nil"
    );
    let e = vm()
        .get_dependencies(
            &["function GetDependencies(o) return {{kind = 'ConfigMap'}} end"],
            &bare,
        )
        .unwrap_err();
    assert!(
        e.message.contains("missing required apiVersion")
            && e.message
                .contains("can not leave name and labelSelector all empty"),
        "{e}"
    );
    assert_eq!(
        vm().get_dependencies(&["function GetDependencies(o) return {} end"], &bare),
        Ok(Vec::new())
    );
}

#[test]
fn scripts_compile_without_running() {
    assert_eq!(
        vm().check("function GetReplicas(o) while true do end end"),
        Ok(())
    );
    let e = vm()
        .check("function GetReplicas(o) return format(( end")
        .unwrap_err();
    assert!(!e.is_empty());
    // A script that never ends is stopped at its deadline.
    let slow = Vm {
        limits: Limits {
            time: std::time::Duration::from_millis(100),
            ..Limits::default()
        },
    };
    let e = slow
        .interpret_health(
            "function InterpretHealth(o) while true do end end",
            &json!({}),
        )
        .unwrap_err();
    assert!(e.message.contains("context deadline exceeded"), "{e}");
}

#[test]
fn customizations_merge_in_name_order_and_dependencies_add_up() {
    let spec = |replicas: &str, deps: &str| -> orrery_api::customization::CustomizationSpec {
        serde_json::from_value(json!({
            "target": {"apiVersion": "x.io/v1", "kind": "Thing"},
            "customizations": {
                "replicaResource": {"luaScript": replicas},
                "dependencyInterpretation": {"luaScript": deps}
            }
        }))
        .unwrap()
    };
    let (a, b) = (spec("-- a", "-- deps a"), spec("-- b", "-- deps b"));
    let c = Customizations::load([("zz", &b), ("aa", &a)]);
    let r = c.rules("x.io/v1", "Thing").unwrap();
    assert_eq!(r.script(Operation::InterpretReplica), Some("-- a"));
    assert_eq!(r.source(Operation::InterpretReplica), Some("aa"));
    assert_eq!(r.dependency_scripts(), ["-- deps a", "-- deps b"]);
    assert!(r.script(Operation::Retain).is_none());
    assert!(
        c.rules("x.io/v2", "Thing").is_none(),
        "versions match exactly"
    );
}
