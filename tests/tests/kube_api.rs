//! The Kubernetes API server stand-in, driven as a client sees it: plain
//! HTTP/1.1 requests and chunked watch streams read line by line.

#![allow(clippy::unwrap_used)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tests::kube_api::{KubeApi, TOKEN, TokenReviewAnswer};
use tests::wait_for;

const WAIT: Duration = Duration::from_secs(5);

/// A response: status code, headers (lower-case names), body.
struct Reply {
    code: u16,
    body: Value,
}

fn read_head(r: &mut BufReader<TcpStream>) -> io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((code, headers));
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
}

/// One chunk of a chunked body; `None` for the last (empty) chunk.
fn read_chunk(r: &mut BufReader<TcpStream>) -> io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let size = usize::from_str_radix(line.trim(), 16)
        .map_err(|_| io::Error::other(format!("bad chunk size {line:?}")))?;
    let mut data = vec![0; size + 2];
    r.read_exact(&mut data)?;
    data.truncate(size);
    Ok((size > 0).then_some(data))
}

fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> io::Result<BufReader<TcpStream>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(WAIT))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    Ok(BufReader::new(s))
}

/// A request with a JSON (or other `content_type`) body.
fn try_call(
    api: &KubeApi,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> io::Result<Reply> {
    let mut r = send(api.addr(), method, path, content_type, body)?;
    let (code, headers) = read_head(&mut r)?;
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut raw = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        while let Some(c) = read_chunk(&mut r)? {
            raw.extend(c);
        }
    } else if let Some(len) = header("content-length") {
        raw.resize(len.parse().unwrap(), 0);
        r.read_exact(&mut raw)?;
    } else {
        r.read_to_end(&mut raw)?;
    }
    let body =
        serde_json::from_slice(&raw).unwrap_or(Value::String(String::from_utf8_lossy(&raw).into()));
    Ok(Reply { code, body })
}

fn call(api: &KubeApi, method: &str, path: &str, body: Option<&Value>) -> Reply {
    let body = body.map(Value::to_string).unwrap_or_default();
    try_call(api, method, path, "application/json", &body).unwrap()
}

fn get(api: &KubeApi, path: &str) -> Reply {
    call(api, "GET", path, None)
}

/// What a watch stream gave next.
#[derive(Debug)]
enum Next {
    Event(Value),
    /// The last chunk: the server ended the stream.
    End,
    /// The connection closed without the last chunk.
    Cut,
}

struct WatchStream {
    r: BufReader<TcpStream>,
    buf: Vec<u8>,
}

impl WatchStream {
    fn open(api: &KubeApi, path: &str) -> WatchStream {
        let mut r = send(api.addr(), "GET", path, "application/json", "").unwrap();
        let (code, _) = read_head(&mut r).unwrap();
        assert_eq!(code, 200, "watch {path}");
        WatchStream { r, buf: Vec::new() }
    }

    fn next(&mut self) -> Next {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Next::Event(serde_json::from_slice(&line).unwrap());
            }
            match read_chunk(&mut self.r) {
                Ok(Some(data)) => self.buf.extend(data),
                Ok(None) => return Next::End,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!("nothing on the watch stream within {WAIT:?}")
                }
                Err(_) => return Next::Cut,
            }
        }
    }

    /// The next event, which must be one.
    fn event(&mut self) -> Value {
        match self.next() {
            Next::Event(v) => v,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    /// The next event that is not a bookmark.
    fn change(&mut self) -> Value {
        loop {
            let e = self.event();
            if e["type"] != "BOOKMARK" {
                return e;
            }
        }
    }
}

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[test]
fn list_returns_items_and_a_resource_version() {
    let api = KubeApi::start_local();
    for (name, app) in [("b", "web"), ("a", "db")] {
        let mut obj = cm(name, json!({}));
        obj["metadata"]["labels"] = json!({"app": app});
        assert_eq!(call(&api, "POST", CMS, Some(&obj)).code, 201);
    }
    call(
        &api,
        "POST",
        "/api/v1/namespaces",
        Some(&json!({"metadata": {"name": "other"}})),
    );
    call(
        &api,
        "POST",
        "/api/v1/namespaces/other/configmaps",
        Some(&cm("c", json!({}))),
    );

    let list = get(&api, CMS);
    assert_eq!(list.code, 200);
    assert_eq!(list.body["kind"], "ConfigMapList");
    let names: Vec<&str> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let list_rv: u64 = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(list_rv, api.resource_version());
    let item = &list.body["items"][0];
    assert_eq!(item["metadata"]["namespace"], "default");
    assert!(
        item["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );
    assert!(item["metadata"]["creationTimestamp"].as_str().is_some());

    let all = get(&api, "/api/v1/configmaps");
    assert_eq!(all.body["items"].as_array().unwrap().len(), 3);
    let web = get(&api, &format!("{CMS}?labelSelector=app%3Dweb"));
    assert_eq!(web.body["items"].as_array().unwrap().len(), 1);
    assert_eq!(web.body["items"][0]["metadata"]["name"], "b");
    let not_web = get(&api, "/api/v1/configmaps?labelSelector=app%20notin%20(web)");
    assert_eq!(not_web.body["items"].as_array().unwrap().len(), 2);
    let by_name = get(&api, "/api/v1/configmaps?fieldSelector=metadata.name%3Dc");
    assert_eq!(by_name.body["items"][0]["metadata"]["namespace"], "other");
    let bad = get(&api, "/api/v1/configmaps?fieldSelector=spec.nodeName%3Dx");
    assert_eq!(bad.code, 400, "{}", bad.body);
}

#[test]
fn a_watch_from_a_list_sees_each_change_in_order_and_bookmarks() {
    let api = KubeApi::start_local();
    api.set_bookmark_interval(Duration::from_millis(200));
    let list = get(&api, CMS);
    let from = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // Made between the list and the watch: replayed from the history.
    let a = call(&api, "POST", CMS, Some(&cm("a", json!({"k": "1"})))).body;

    let mut w = WatchStream::open(
        &api,
        &format!("{CMS}?watch=1&resourceVersion={from}&allowWatchBookmarks=true&timeoutSeconds=30"),
    );
    let added = w.change();
    assert_eq!(added["type"], "ADDED");
    assert_eq!(added["object"]["metadata"]["name"], "a");
    assert_eq!(rv(&added["object"]), rv(&a));

    let mut changed = a.clone();
    changed["data"]["k"] = json!("2");
    let put = call(&api, "PUT", &format!("{CMS}/a"), Some(&changed));
    assert_eq!(put.code, 200, "{}", put.body);
    let del = call(&api, "DELETE", &format!("{CMS}/a"), None);
    assert_eq!(del.code, 200, "{}", del.body);

    let modified = w.change();
    assert_eq!(modified["type"], "MODIFIED");
    assert_eq!(modified["object"]["data"]["k"], "2");
    let deleted = w.change();
    assert_eq!(deleted["type"], "DELETED");
    assert!(rv(&a) < rv(&modified["object"]));
    assert!(rv(&modified["object"]) < rv(&deleted["object"]));

    let bookmark = loop {
        let e = w.event();
        if e["type"] == "BOOKMARK" {
            break e;
        }
    };
    assert_eq!(
        bookmark["object"],
        json!({"kind": "ConfigMap", "apiVersion": "v1",
               "metadata": {"resourceVersion": api.resource_version().to_string()}})
    );
}

#[test]
fn a_watch_with_a_selector_sees_objects_enter_and_leave_it() {
    let api = KubeApi::start_local();
    let mut w = WatchStream::open(&api, &format!("{CMS}?watch=true&labelSelector=app%3Dweb"));
    let mut obj = cm("a", json!({}));
    call(&api, "POST", CMS, Some(&obj));
    obj["metadata"]["labels"] = json!({"app": "web"});
    call(&api, "PUT", &format!("{CMS}/a"), Some(&obj));
    obj["metadata"]["labels"] = json!({"app": "db"});
    call(&api, "PUT", &format!("{CMS}/a"), Some(&obj));
    let types: Vec<Value> = (0..2).map(|_| w.change()["type"].clone()).collect();
    assert_eq!(types, [json!("ADDED"), json!("DELETED")]);
}

#[test]
fn after_compaction_an_old_version_is_410_expired() {
    let api = KubeApi::start_local();
    let old = api.resource_version();
    call(&api, "POST", CMS, Some(&cm("a", json!({}))));
    api.compact();

    let mut w = WatchStream::open(&api, &format!("{CMS}?watch=1&resourceVersion={old}"));
    let err = w.event();
    assert_eq!(err["type"], "ERROR");
    assert_eq!(err["object"]["kind"], "Status");
    assert_eq!(err["object"]["code"], 410);
    assert_eq!(err["object"]["reason"], "Expired");
    assert!(matches!(w.next(), Next::End));

    let exact = get(
        &api,
        &format!("{CMS}?resourceVersion={old}&resourceVersionMatch=Exact"),
    );
    assert_eq!(
        (exact.code, exact.body["reason"].clone()),
        (410, json!("Expired"))
    );
    let newer = get(
        &api,
        &format!("{CMS}?resourceVersion={old}&resourceVersionMatch=NotOlderThan"),
    );
    assert_eq!(newer.code, 200);
    assert_eq!(newer.body["items"].as_array().unwrap().len(), 1);

    // From the current version on, watches work again.
    let now = api.resource_version();
    let mut w = WatchStream::open(&api, &format!("{CMS}?watch=1&resourceVersion={now}"));
    call(&api, "POST", CMS, Some(&cm("b", json!({}))));
    assert_eq!(w.change()["object"]["metadata"]["name"], "b");
}

#[test]
fn break_watches_cuts_every_open_stream() {
    let api = KubeApi::start_local();
    let mut a = WatchStream::open(&api, &format!("{CMS}?watch=1"));
    let mut b = WatchStream::open(&api, "/api/v1/pods?watch=1");
    wait_for("two open watches", WAIT, || {
        (api.watch_count() == 2).then_some(())
    });
    api.break_watches();
    assert!(matches!(a.next(), Next::Cut));
    assert!(matches!(b.next(), Next::Cut));
    wait_for("no open watch", WAIT, || {
        (api.watch_count() == 0).then_some(())
    });
}

#[test]
fn a_watch_times_out_cleanly_with_a_last_bookmark() {
    let api = KubeApi::start_local();
    api.set_bookmark_interval(Duration::from_secs(60));
    let mut w = WatchStream::open(
        &api,
        &format!("{CMS}?watch=1&timeoutSeconds=1&allowWatchBookmarks=true"),
    );
    assert_eq!(w.event()["type"], "BOOKMARK");
    assert!(matches!(w.next(), Next::End));
}

#[test]
fn a_streaming_list_ends_its_initial_events_with_a_bookmark() {
    let api = KubeApi::start_local();
    call(&api, "POST", CMS, Some(&cm("a", json!({}))));
    let mut w = WatchStream::open(
        &api,
        &format!(
            "{CMS}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        ),
    );
    let added = w.event();
    assert_eq!(
        (
            added["type"].clone(),
            added["object"]["metadata"]["name"].clone()
        ),
        (json!("ADDED"), json!("a"))
    );
    let end = w.event();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let without_match = get(&api, &format!("{CMS}?watch=1&sendInitialEvents=true"));
    assert_eq!(without_match.code, 422);
}

#[test]
fn writes_answer_409_and_404_as_the_api_does() {
    let api = KubeApi::start_local();
    let a = call(&api, "POST", CMS, Some(&cm("a", json!({})))).body;
    let again = call(&api, "POST", CMS, Some(&cm("a", json!({}))));
    assert_eq!(again.code, 409);
    assert_eq!(again.body["reason"], "AlreadyExists");
    assert_eq!(again.body["message"], "configmaps \"a\" already exists");

    let mut stale = a.clone();
    stale["data"] = json!({"k": "1"});
    assert_eq!(
        call(&api, "PUT", &format!("{CMS}/a"), Some(&stale)).code,
        200
    );
    stale["data"] = json!({"k": "2"});
    let conflict = call(&api, "PUT", &format!("{CMS}/a"), Some(&stale));
    assert_eq!(conflict.code, 409);
    assert_eq!(conflict.body["reason"], "Conflict");
    assert_eq!(get(&api, &format!("{CMS}/a")).body["data"]["k"], "1");

    let missing = get(&api, &format!("{CMS}/nope"));
    assert_eq!(
        (missing.code, missing.body["reason"].clone()),
        (404, json!("NotFound"))
    );
    assert_eq!(call(&api, "DELETE", &format!("{CMS}/nope"), None).code, 404);
    let no_ns = call(
        &api,
        "POST",
        "/api/v1/namespaces/nowhere/configmaps",
        Some(&cm("x", json!({}))),
    );
    assert_eq!(no_ns.code, 404);
    assert_eq!(no_ns.body["message"], "namespaces \"nowhere\" not found");
    let crd = call(
        &api,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/virtualservices.networking.istio.io",
        None,
    );
    assert_eq!(crd.code, 405);
}

#[test]
fn merge_patch_and_server_side_apply() {
    let api = KubeApi::start_local();
    let a = call(
        &api,
        "POST",
        CMS,
        Some(&cm("a", json!({"x": "1", "y": "2"}))),
    )
    .body;
    let patched = try_call(
        &api,
        "PATCH",
        &format!("{CMS}/a"),
        "application/merge-patch+json",
        r#"{"data": {"x": null, "z": "3"}}"#,
    )
    .unwrap();
    assert_eq!(patched.code, 200);
    assert_eq!(patched.body["data"], json!({"y": "2", "z": "3"}));
    assert!(rv(&patched.body) > rv(&a));

    let strategic = try_call(
        &api,
        "PATCH",
        &format!("{CMS}/a"),
        "application/strategic-merge-patch+json",
        r#"{"data": {"y": "9"}}"#,
    )
    .unwrap();
    assert_eq!(strategic.body["data"], json!({"y": "9", "z": "3"}));

    let stale = try_call(
        &api,
        "PATCH",
        &format!("{CMS}/a"),
        "application/merge-patch+json",
        &format!(
            r#"{{"metadata": {{"resourceVersion": "{}"}}, "data": {{}}}}"#,
            rv(&a)
        ),
    )
    .unwrap();
    assert_eq!(stale.code, 409);

    let apply = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\ndata:\n  k: v\n";
    let no_manager = try_call(
        &api,
        "PATCH",
        &format!("{CMS}/b"),
        "application/apply-patch+yaml",
        apply,
    )
    .unwrap();
    assert_eq!(no_manager.code, 422);
    let created = try_call(
        &api,
        "PATCH",
        &format!("{CMS}/b?fieldManager=test&force=true"),
        "application/apply-patch+yaml",
        apply,
    )
    .unwrap();
    assert_eq!(created.code, 201, "{}", created.body);
    assert_eq!(created.body["data"]["k"], "v");
    let json_patch = try_call(
        &api,
        "PATCH",
        &format!("{CMS}/b"),
        "application/json-patch+json",
        "[]",
    )
    .unwrap();
    assert_eq!(json_patch.code, 415);
}

#[test]
fn status_is_written_only_through_its_subresource() {
    let api = KubeApi::start_local();
    let vs = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                    "metadata": {"name": "r"}, "spec": {"hosts": ["a"]}, "status": {"x": 1}});
    let path = "/apis/networking.istio.io/v1/namespaces/default/virtualservices/r";
    let created = call(
        &api,
        "POST",
        "/apis/networking.istio.io/v1/namespaces/default/virtualservices",
        Some(&vs),
    );
    assert_eq!(created.body.get("status"), None);
    assert_eq!(created.body["metadata"]["generation"], 1);

    let status = call(
        &api,
        "PUT",
        &format!("{path}/status"),
        Some(
            &json!({"metadata": {"name": "r"}, "status": {"ok": true}, "spec": {"hosts": ["ignored"]}}),
        ),
    );
    assert_eq!(status.code, 200, "{}", status.body);
    assert_eq!(status.body["status"], json!({"ok": true}));
    assert_eq!(status.body["spec"]["hosts"], json!(["a"]));
    assert_eq!(status.body["metadata"]["generation"], 1);

    let mut main = status.body.clone();
    main["spec"]["hosts"] = json!(["b"]);
    main["status"] = json!({"ok": false});
    let updated = call(&api, "PUT", path, Some(&main)).body;
    assert_eq!(updated["status"], json!({"ok": true}));
    assert_eq!(updated["metadata"]["generation"], 2);
}

#[test]
fn istio_objects_are_served_under_every_version_of_their_resource() {
    let api = KubeApi::start_local();
    let mut w = WatchStream::open(
        &api,
        "/apis/networking.istio.io/v1beta1/virtualservices?watch=1",
    );
    let vs = json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
                    "metadata": {"name": "r", "namespace": "default"}, "spec": {"hosts": ["a"]}});
    let created = call(
        &api,
        "POST",
        "/apis/networking.istio.io/v1alpha3/namespaces/default/virtualservices",
        Some(&vs),
    );
    assert_eq!(created.code, 201, "{}", created.body);
    let v1 = get(
        &api,
        "/apis/networking.istio.io/v1/namespaces/default/virtualservices/r",
    );
    assert_eq!(v1.body["apiVersion"], "networking.istio.io/v1");
    assert_eq!(v1.body["spec"]["hosts"], json!(["a"]));
    assert_eq!(
        w.change()["object"]["apiVersion"],
        "networking.istio.io/v1beta1"
    );

    assert_eq!(
        get(&api, "/apis/networking.istio.io/v1/envoyfilters").code,
        404
    );
    assert_eq!(
        get(&api, "/apis/networking.istio.io/v1alpha3/envoyfilters").code,
        200
    );

    let resources = get(&api, "/apis/networking.istio.io/v1").body;
    assert_eq!(resources["kind"], "APIResourceList");
    let vs = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "virtualservices")
        .unwrap();
    assert_eq!(
        (vs["kind"].clone(), vs["namespaced"].clone()),
        (json!("VirtualService"), json!(true))
    );
    let groups = get(&api, "/apis").body;
    let networking = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "networking.istio.io")
        .unwrap();
    assert_eq!(networking["preferredVersion"]["version"], "v1");
    let crds = get(
        &api,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    )
    .body;
    assert!(
        crds["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["metadata"]["name"] == "peerauthentications.security.istio.io")
    );
    assert_eq!(get(&api, "/version").body["major"], "1");
    assert_eq!(get(&api, "/api").body["versions"], json!(["v1"]));
}

#[test]
fn pages_come_from_one_snapshot_until_it_is_compacted() {
    let api = KubeApi::start_local();
    for n in ["a", "b", "c"] {
        call(&api, "POST", CMS, Some(&cm(n, json!({}))));
    }
    let first = get(&api, &format!("{CMS}?limit=2")).body;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    assert_eq!(first["metadata"]["remainingItemCount"], 1);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let token = form_encode(&token);
    // Deleted after the first page: the second still has it.
    call(&api, "DELETE", &format!("{CMS}/c"), None);
    let second = get(&api, &format!("{CMS}?limit=2&continue={token}")).body;
    assert_eq!(second["items"][0]["metadata"]["name"], "c");
    assert_eq!(
        second["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    assert!(second["metadata"].get("continue").is_none());
    api.compact();
    let gone = get(&api, &format!("{CMS}?limit=2&continue={token}"));
    assert_eq!(
        (gone.code, gone.body["reason"].clone()),
        (410, json!("Expired"))
    );
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn direct_writes_are_watched_like_api_writes() {
    let api = KubeApi::start_local();
    let mut w = WatchStream::open(&api, "/api/v1/pods?watch=1");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                     "status": {"podIP": "10.0.0.1"}});
    api.create(pod.clone()).unwrap();
    assert_eq!(api.create(pod).unwrap_err().code, 409);
    api.apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "labels": {"a": "b"}}}))
        .unwrap();
    api.delete("v1", "Pod", "default", "p").unwrap();
    let events: Vec<(Value, Value)> = (0..3)
        .map(|_| {
            let e = w.change();
            (e["type"].clone(), e["object"]["status"]["podIP"].clone())
        })
        .collect();
    assert_eq!(
        events,
        [
            (json!("ADDED"), json!("10.0.0.1")),
            (json!("MODIFIED"), json!("10.0.0.1")),
            (json!("DELETED"), json!("10.0.0.1")),
        ]
    );
    assert!(api.get("v1", "Pod", "default", "p").is_none());
}

#[test]
fn token_reviews_are_answered_by_the_test_and_recorded() {
    let api = KubeApi::start_local();
    api.set_token_review(Arc::new(|token: &str, audiences: &[String]| {
        if token == "good" {
            let valid: Vec<String> = audiences
                .iter()
                .filter(|a| *a == "istio-ca")
                .cloned()
                .collect();
            TokenReviewAnswer::service_account("istio-system", "istiod", &valid)
        } else {
            TokenReviewAnswer::Unauthenticated("invalid bearer token".into())
        }
    }));
    let review = |token: &str| {
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                          "spec": {"token": token, "audiences": ["istio-ca", "other"]}});
        call(
            &api,
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            Some(&body),
        )
    };
    let good = review("good");
    assert_eq!(good.code, 201);
    assert_eq!(good.body["status"]["authenticated"], true);
    assert_eq!(
        good.body["status"]["user"]["username"],
        "system:serviceaccount:istio-system:istiod"
    );
    assert_eq!(good.body["status"]["audiences"], json!(["istio-ca"]));
    let bad = review("bad");
    assert_eq!(bad.body["status"].get("authenticated"), None);
    assert_eq!(bad.body["status"]["error"], "invalid bearer token");
    let seen: Vec<String> = api.token_reviews().into_iter().map(|r| r.token).collect();
    assert_eq!(seen, ["good", "bad"]);
    assert_eq!(api.token_reviews()[0].audiences, ["istio-ca", "other"]);
}

#[test]
fn unreachable_cuts_every_connection_until_restored() {
    let api = KubeApi::start_local();
    let mut w = WatchStream::open(&api, &format!("{CMS}?watch=1"));
    wait_for("the watch", WAIT, || (api.watch_count() == 1).then_some(()));
    api.set_unreachable(true);
    assert!(matches!(w.next(), Next::Cut));
    assert!(try_call(&api, "GET", CMS, "application/json", "").is_err());
    api.set_unreachable(false);
    assert_eq!(get(&api, CMS).code, 200);
}

#[test]
fn a_short_unreachable_window_still_cuts_open_watches() {
    let api = KubeApi::start_local();
    let mut w = WatchStream::open(&api, &format!("{CMS}?watch=1"));
    wait_for("the watch", WAIT, || (api.watch_count() == 1).then_some(()));
    // Reachable again before the server's tasks could look: what was written
    // meanwhile still never reaches the old stream.
    api.set_unreachable(true);
    api.create(cm("unseen", json!({}))).unwrap();
    api.set_unreachable(false);
    assert!(matches!(w.next(), Next::Cut));
}

#[test]
fn latency_delays_answers() {
    let api = KubeApi::start_local();
    api.set_latency(Duration::from_millis(300));
    let start = std::time::Instant::now();
    assert_eq!(get(&api, CMS).code, 200);
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[test]
fn the_request_log_and_the_kubeconfig() {
    let api = KubeApi::start_local();
    get(&api, &format!("{CMS}?labelSelector=a%3Db"));
    let log = api.requests();
    let last = log.last().unwrap();
    assert_eq!((last.method.as_str(), last.path.as_str()), ("GET", CMS));
    assert_eq!(last.param("labelSelector").as_deref(), Some("a=b"));
    assert_eq!(last.bearer.as_deref(), Some(TOKEN));
    assert!(last.is_list_of("configmaps"));
    api.clear_requests();
    assert!(api.requests().is_empty());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.kubeconfig(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    let cfg: Value = serde_yaml_ng::from_str(&text).unwrap();
    let ctx = cfg["current-context"].as_str().unwrap();
    let context = cfg["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == ctx)
        .unwrap();
    let cluster = cfg["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == context["context"]["cluster"])
        .unwrap();
    assert_eq!(
        cluster["cluster"]["server"],
        format!("http://{}", api.addr())
    );
    let user = cfg["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == context["context"]["user"])
        .unwrap();
    assert_eq!(user["user"]["token"], TOKEN);
}

/// kube-rs, the client istiod uses, against the stand-in: its requests,
/// its error handling and its watcher's recovery.
mod kube_rs {
    use std::collections::BTreeMap;
    use std::path::Path;

    use futures::StreamExt;
    use futures::stream::BoxStream;
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
    use kube::runtime::watcher::{self, Event};

    use super::*;

    async fn client(api: &KubeApi, dir: &Path) -> kube::Client {
        let path = dir.join("kubeconfig");
        api.kubeconfig(&path);
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    fn typed(name: &str, data: Value) -> ConfigMap {
        serde_json::from_value(cm(name, data)).unwrap()
    }

    /// The API's answer to a request that failed: (code, reason).
    fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
        match r {
            Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn kube_rs_reads_writes_and_discovers() {
        let api = KubeApi::start_local();
        let dir = tempfile::tempdir().unwrap();
        let client = client(&api, dir.path()).await;
        assert_eq!(client.apiserver_version().await.unwrap().major, "1");

        let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
        let pp = PostParams::default();
        let a = cms
            .create(&pp, &typed("a", json!({"k": "1"})))
            .await
            .unwrap();
        assert!(a.metadata.uid.is_some());
        assert_eq!(
            api_error(cms.create(&pp, &typed("a", json!({}))).await),
            (409, "AlreadyExists".into())
        );
        let mut edited = a.clone();
        edited.data = Some(BTreeMap::from([("k".into(), "2".into())]));
        cms.replace("a", &pp, &edited).await.unwrap();
        assert_eq!(
            api_error(cms.replace("a", &pp, &edited).await),
            (409, "Conflict".into())
        );

        let apply = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"x": "1"}});
        cms.patch(
            "b",
            &PatchParams::apply("kube-api-test"),
            &Patch::Apply(apply),
        )
        .await
        .unwrap();
        let merged = cms
            .patch(
                "b",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"y": "2"}})),
            )
            .await
            .unwrap();
        assert_eq!(
            merged.data.unwrap(),
            BTreeMap::from([("x".into(), "1".into()), ("y".into(), "2".into())])
        );
        let names: Vec<String> = cms
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        cms.delete("a", &DeleteParams::default()).await.unwrap();
        assert_eq!(api_error(cms.get("a").await).0, 404);

        let legacy = kube::Discovery::new(client.clone()).run().await.unwrap();
        let aggregated = kube::Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap();
        for d in [legacy, aggregated] {
            let networking = d.get("networking.istio.io").unwrap();
            assert_eq!(networking.preferred_version_or_latest(), "v1");
            let (vs, caps) = networking.recommended_kind("VirtualService").unwrap();
            assert_eq!(
                (vs.plural.as_str(), vs.version.as_str()),
                ("virtualservices", "v1")
            );
            assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
            assert!(d.get("").unwrap().recommended_kind("ConfigMap").is_some());
            assert!(d.has_group("security.istio.io"));
        }

        api.set_token_review(Arc::new(|token: &str, audiences: &[String]| {
            if token == "good" {
                TokenReviewAnswer::service_account("demo", "sleep", audiences)
            } else {
                TokenReviewAnswer::Unauthenticated("invalid bearer token".into())
            }
        }));
        let reviews: Api<TokenReview> = Api::all(client);
        let review = |token: &str| TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.into()),
                audiences: Some(vec!["istio-ca".into()]),
            },
            ..Default::default()
        };
        let good = reviews
            .create(&pp, &review("good"))
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(good.authenticated, Some(true));
        assert_eq!(
            good.user.unwrap().username.as_deref(),
            Some("system:serviceaccount:demo:sleep")
        );
        assert_eq!(good.audiences.unwrap(), ["istio-ca"]);
        let bad = reviews
            .create(&pp, &review("bad"))
            .await
            .unwrap()
            .status
            .unwrap();
        assert_ne!(bad.authenticated, Some(true));
        assert_eq!(bad.error.as_deref(), Some("invalid bearer token"));
    }

    type Events = BoxStream<'static, Result<Event<ConfigMap>, watcher::Error>>;

    /// The watcher's next event, in short: `Init`, `InitApply a`, `InitDone`,
    /// `Apply a`, `Delete a`, or `error`.
    async fn next(w: &mut Events) -> String {
        let e = tokio::time::timeout(WAIT, w.next())
            .await
            .expect("a watcher event in time")
            .expect("the watcher does not end");
        let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
        match e {
            Ok(Event::Init) => "Init".into(),
            Ok(Event::InitApply(c)) => format!("InitApply {}", name(&c)),
            Ok(Event::InitDone) => "InitDone".into(),
            Ok(Event::Apply(c)) => format!("Apply {}", name(&c)),
            Ok(Event::Delete(c)) => format!("Delete {}", name(&c)),
            Err(_) => "error".into(),
        }
    }

    /// Events up to and including `last`, errors left out.
    async fn until(w: &mut Events, last: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let e = next(w).await;
            if e != "error" {
                seen.push(e.clone());
            }
            if e == last {
                return seen;
            }
        }
    }

    #[tokio::test]
    async fn kube_rs_watcher_resumes_after_a_cut_and_relists_after_410() {
        let api = KubeApi::start_local();
        api.set_bookmark_interval(Duration::from_millis(100));
        let dir = tempfile::tempdir().unwrap();
        let cms: Api<ConfigMap> = Api::default_namespaced(client(&api, dir.path()).await);
        api.create(cm("a", json!({}))).unwrap();
        let mut w: Events = watcher::watcher(cms.clone(), watcher::Config::default()).boxed();
        assert_eq!(
            until(&mut w, "InitDone").await,
            ["Init", "InitApply a", "InitDone"]
        );
        api.create(cm("b", json!({}))).unwrap();
        assert_eq!(next(&mut w).await, "Apply b");

        // Cut mid-stream: the watcher resumes from its resourceVersion.
        api.break_watches();
        api.create(cm("c", json!({}))).unwrap();
        assert_eq!(until(&mut w, "Apply c").await, ["Apply c"]);

        // Changed and compacted while unreachable: the resumed watch is 410
        // Gone, and the watcher lists again.
        api.set_unreachable(true);
        api.delete("v1", "ConfigMap", "default", "a").unwrap();
        api.create(cm("d", json!({}))).unwrap();
        api.compact();
        api.clear_requests();
        api.set_unreachable(false);
        assert_eq!(
            until(&mut w, "InitDone").await,
            [
                "Init",
                "InitApply b",
                "InitApply c",
                "InitApply d",
                "InitDone"
            ]
        );
        let log = api.requests();
        let watch_410 = log.iter().position(|r| r.is_watch()).unwrap();
        let relist = log.iter().position(|r| r.is_list_of("configmaps")).unwrap();
        assert!(watch_410 < relist, "{log:?}");

        // A streaming list (sendInitialEvents) ends at its bookmark.
        let config = watcher::Config::default().streaming_lists();
        let mut s: Events = watcher::watcher(cms, config).boxed();
        assert_eq!(
            until(&mut s, "InitDone").await,
            [
                "Init",
                "InitApply b",
                "InitApply c",
                "InitApply d",
                "InitDone"
            ]
        );
    }
}
