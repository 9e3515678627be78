//! pilot-agent runs Envoy: Istio's bootstrap, readiness on :15020 and :15021,
//! merged metrics, SIGTERM drain and Envoy exit handling. Each test's Pod is a
//! network namespace of its own, so the agent and Envoy keep Istio's ports.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tests::netns::Netns;
use tests::{PodDir, Proc, envoy_bin, http_get, wait_for};

struct Pod {
    ns: Netns,
    dir: PodDir,
    agent: Proc,
    _tmp: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// GET inside the Pod's network.
fn get(ns: &Netns, port: u16, path: &'static str) -> std::io::Result<(u16, String)> {
    ns.run(move || http_get(addr(port), path))
}

/// Starts an agent in a fresh Pod. `ads` serves the given resources on the
/// agent's XDS socket (standing in for istiod until the xDS proxy exists).
fn start_pod(extra_env: &[(&str, &str)], ads: Option<tests::ads::Resources>) -> Pod {
    start_pod_with(extra_env, ads, &[])
}

fn start_pod_with(
    extra_env: &[(&str, &str)],
    ads: Option<tests::ads::Resources>,
    args: &[&str],
) -> Pod {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("pod");
    let dir = PodDir::new(tmp.path(), "", None);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    if let Some(res) = ads {
        serve_ads(&ns, &rt, res);
    }
    let envoy = envoy_bin().display().to_string();
    let proxy_config = format!(
        r#"{{"binaryPath": "{envoy}", "drainDuration": "1s", "terminationDrainDuration": "4s", {}}}"#,
        tests::ads::PROXY_CONFIG_FIELDS
    );
    let mut env: Vec<(&str, &str)> = vec![
        ("POD_NAME", "app-1"),
        ("POD_NAMESPACE", "default"),
        ("SERVICE_ACCOUNT", "app"),
        ("INSTANCE_IP", "127.0.0.1"),
        ("CA_ADDR", "127.0.0.1:1"),
        ("PROXY_CONFIG", &proxy_config),
    ];
    env.extend_from_slice(extra_env);
    let agent = spawn_agent(&ns, &dir, &env, args);
    Pod {
        ns,
        dir,
        agent,
        _tmp: tmp,
        _rt: rt,
    }
}

/// Serves `res` as the Pod's upstream xDS server (standing in for istiod).
fn serve_ads(ns: &Netns, rt: &tokio::runtime::Runtime, res: tests::ads::Resources) {
    let listener = ns.run(|| TcpListener::bind(("127.0.0.1", tests::ads::ADS_PORT)).unwrap());
    rt.block_on(async { tests::ads::serve_tcp(listener, res).unwrap() });
}

fn spawn_agent(ns: &Netns, dir: &PodDir, env: &[(&str, &str)], args: &[&str]) -> Proc {
    let mut cmd = ns.command(tests::bin("pilot-agent"));
    cmd.current_dir(&dir.dir)
        .args([
            "proxy",
            "sidecar",
            "--concurrency",
            "1",
            "--proxyLogLevel",
            "warning",
        ])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied());
    Proc::spawn("pilot-agent", cmd, &dir.dir.join("agent.log"))
}

fn ready(ns: &Netns, port: u16) -> Option<(u16, String)> {
    get(ns, port, "/healthz/ready").ok()
}

#[test]
fn readiness_turns_200_only_after_cds_and_lds() {
    // No ADS server yet: Envoy starts but gets no configuration.
    let mut pod = start_pod(&[], None);
    let (code, body) = wait_for("the status server", Duration::from_secs(30), || {
        ready(&pod.ns, 15020)
    });
    assert_eq!(code, 503, "{body}");
    // Envoy's static listeners (15021) open only once its first CDS is in:
    // kubelet's probe is refused until then.
    assert!(ready(&pod.ns, 15021).is_none_or(|(c, _)| c != 200));
    // Once Envoy's admin answers, the reason is Istio's.
    let (code, body) = wait_for("Istio's not-ready reason", Duration::from_secs(30), || {
        ready(&pod.ns, 15020).filter(|(_, b)| b.contains("config not received from XDS server"))
    });
    assert_eq!(code, 503, "{body}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        ready(&pod.ns, 15020).unwrap().0,
        503,
        "still not ready without CDS/LDS"
    );
    assert!(ready(&pod.ns, 15021).is_none_or(|(c, _)| c != 200));

    // The bootstrap is Istio's, where Istio puts it.
    let bootstrap: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(pod.dir.dir.join("etc/istio/proxy/envoy-rev.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        bootstrap["node"]["id"],
        "sidecar~127.0.0.1~app-1.default~default.svc.cluster.local"
    );
    assert_eq!(
        bootstrap["dynamic_resources"]["ads_config"]["api_type"],
        "DELTA_GRPC"
    );

    // Now istiod (the tests' ADS server) comes up: through the agent's xDS
    // proxy Envoy gets CDS and LDS, and both ports turn 200.
    serve_ads(&pod.ns, &pod._rt, tests::ads::inbound_http(8000, 8080));
    wait_for("15020 ready", Duration::from_secs(30), || {
        ready(&pod.ns, 15020).filter(|(c, _)| *c == 200)
    });
    wait_for("15021 ready", Duration::from_secs(10), || {
        ready(&pod.ns, 15021).filter(|(c, _)| *c == 200)
    });
    assert!(pod.agent.alive());
}

/// A slow HTTP app inside the Pod: answers after `delay`.
fn slow_app(ns: &Netns, port: u16, delay: Duration) {
    let listener = ns.run(move || TcpListener::bind(addr(port)).unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().take(64) {
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                std::thread::sleep(delay);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nslow",
                );
            });
        }
    });
}

#[test]
fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let mut pod = start_pod(&[], Some(tests::ads::inbound_http(8000, 8080)));
    slow_app(&pod.ns, 8080, Duration::from_millis(2500));
    wait_for("ready", Duration::from_secs(30), || {
        ready(&pod.ns, 15020).filter(|(c, _)| *c == 200)
    });

    let slow = pod.ns.spawn(|| http_get(addr(8000), "/slow"));
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pod.agent.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();

    // Istio's Envoy keeps accepting during the graceful drain period
    // (drainDuration, 1s here) and closes its inbound listeners after it.
    std::thread::sleep(Duration::from_millis(1600));
    let refused = pod
        .ns
        .run(|| TcpStream::connect_timeout(&addr(8000), Duration::from_secs(1)));
    assert!(
        refused.is_err(),
        "new connections must be refused once the drain period is over"
    );
    let (code, body) = slow
        .join()
        .unwrap()
        .expect("the in-flight request completes");
    assert_eq!((code, body.as_str()), (200, "slow"));

    let status = pod
        .agent
        .terminate(Duration::from_secs(10))
        .expect("agent exits");
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        pod.agent.log()
    );
    // terminationDrainDuration (4s) plus a second.
    assert!(
        sent.elapsed() <= Duration::from_secs(5),
        "took {:?}",
        sent.elapsed()
    );
    assert!(
        pod.agent.log().contains("Envoy aborted normally"),
        "{}",
        pod.agent.log()
    );
}

#[test]
fn envoy_killed_makes_the_agent_exit_as_istio_does() {
    let mut pod = start_pod(&[], Some(tests::ads::inbound_http(8000, 8080)));
    wait_for("ready", Duration::from_secs(30), || {
        ready(&pod.ns, 15020).filter(|(c, _)| *c == 200)
    });
    let envoy_pid = wait_for("Envoy's pid", Duration::from_secs(5), || {
        let out = std::process::Command::new("pgrep")
            .args(["-P", &pod.agent.pid().to_string()])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()?
            .trim()
            .parse::<i32>()
            .ok()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(envoy_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = wait_for("the agent to exit", Duration::from_secs(10), || {
        if pod.agent.alive() {
            None
        } else {
            pod.agent.terminate(Duration::from_secs(1))
        }
    });
    let log = pod.agent.log();
    assert!(
        status.success(),
        "Istio's agent exits 0 after Envoy exits: {status:?}\n{log}"
    );
    assert!(
        log.contains("Envoy exited with error: signal: killed"),
        "{log}"
    );
    assert!(
        !pod.dir.dir.join("etc/istio/proxy/envoy-rev.json").exists(),
        "the bootstrap is removed"
    );
    assert!(
        get(&pod.ns, 15020, "/healthz/ready").is_err(),
        "the status server is down"
    );
}

#[test]
fn merged_metrics_hold_agent_envoy_and_app_lines() {
    let annotations = r#"{"scrape":"true","path":"/metrics","port":"9090"}"#;
    let pod = start_pod(
        &[("ISTIO_PROMETHEUS_ANNOTATIONS", annotations)],
        Some(tests::ads::inbound_http(8000, 8080)),
    );
    wait_for("ready", Duration::from_secs(30), || {
        ready(&pod.ns, 15020).filter(|(c, _)| *c == 200)
    });
    // No application yet: still 200 with the agent's and Envoy's metrics.
    let (code, body) = get(&pod.ns, 15020, "/stats/prometheus").unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("istio_agent_scrapes_total"), "agent lines");
    assert!(body.contains("envoy_server_live"), "Envoy lines");
    assert!(
        body.contains("istio_agent_scrape_failures_total{type=\"application\"} 1"),
        "{body}"
    );
    // Start the application's metrics endpoint.
    let listener = pod.ns.run(|| TcpListener::bind(addr(9090)).unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().take(16) {
            let Ok(mut c) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let body = "# TYPE app_requests_total counter\napp_requests_total 42\n";
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let (code, body) = get(&pod.ns, 15020, "/stats/prometheus").unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("app_requests_total 42"), "app lines");
    assert!(body.contains("envoy_server_live") && body.contains("istio_agent_scrapes_total"));
}

#[test]
fn bad_proxy_config_stops_start_up_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("pod");
    let dir = PodDir::new(tmp.path(), "", None);
    for (pc, want) in [
        ("{not yaml: [", "PROXY_CONFIG: not valid YAML"),
        (
            r#"{"drainDurationX": "5s"}"#,
            "unknown field `drainDurationX`",
        ),
        (
            r#"{"terminationDrainDuration": "soon"}"#,
            "invalid duration \"soon\"",
        ),
    ] {
        let env = [
            ("POD_NAMESPACE", "default"),
            ("SERVICE_ACCOUNT", "app"),
            ("PROXY_CONFIG", pc),
        ];
        let mut agent = spawn_agent(&ns, &dir, &env, &[]);
        let status = wait_for("the agent to stop", Duration::from_secs(10), || {
            if agent.alive() {
                None
            } else {
                agent.terminate(Duration::from_secs(1))
            }
        });
        assert_eq!(status.code(), Some(255), "{}", agent.log());
        assert!(
            agent.log().contains(want),
            "{want:?} not in:\n{}",
            agent.log()
        );
    }
}

#[test]
fn missing_envoy_binary_is_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let ns = Netns::new("pod");
    let dir = PodDir::new(tmp.path(), "", None);
    let env = [
        ("POD_NAMESPACE", "default"),
        ("SERVICE_ACCOUNT", "app"),
        ("CA_ADDR", "127.0.0.1:1"),
        ("PROXY_CONFIG", r#"{"binaryPath": "/nonexistent/envoy"}"#),
    ];
    let mut agent = spawn_agent(&ns, &dir, &env, &[]);
    let status = wait_for("the agent to stop", Duration::from_secs(10), || {
        if agent.alive() {
            None
        } else {
            agent.terminate(Duration::from_secs(1))
        }
    });
    assert_eq!(status.code(), Some(255));
    let log = agent.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("\terror\t")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("/nonexistent/envoy"), "{log}");
    assert!(lines[0].contains("does not exist"), "{log}");
}

#[test]
fn unknown_flags_from_newer_templates_are_accepted() {
    let pod = start_pod_with(
        &[],
        Some(tests::ads::inbound_http(8000, 8080)),
        &["--someFutureFlag", "value", "--anotherOne=1"],
    );
    wait_for("ready", Duration::from_secs(30), || {
        ready(&pod.ns, 15020).filter(|(c, _)| *c == 200)
    });
    let log = pod.agent.log();
    assert!(
        log.contains("ignoring unknown flag --someFutureFlag value"),
        "{log}"
    );
    assert!(
        log.contains("ignoring unknown flag --anotherOne=1"),
        "{log}"
    );
}

#[test]
fn wait_request_and_quitquitquit_work_inside_the_pod() {
    let mut pod = start_pod(&[], Some(tests::ads::inbound_http(8000, 8080)));
    // `pilot-agent wait` (the postStart hook) returns 0 once Envoy is ready.
    let out = pod
        .ns
        .command(tests::bin("pilot-agent"))
        .args(["wait", "--timeoutSeconds", "30"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Envoy is ready!"));
    // `pilot-agent request` reaches Envoy's admin API.
    let out = pod
        .ns
        .command(tests::bin("pilot-agent"))
        .args(["request", "GET", "server_info"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["state"], "LIVE");
    assert_eq!(
        info["command_line_options"]["drain_strategy"], "Immediate",
        "Envoy runs with Istio's command line"
    );
    // Only localhost may quit, and only with POST.
    let get = pod
        .ns
        .run(|| http_get(addr(15020), "/quitquitquit"))
        .unwrap();
    assert_eq!(get.0, 405);
    let quit = pod.ns.run(|| {
        let mut s = TcpStream::connect(addr(15020))?;
        s.write_all(b"POST /quitquitquit HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        let mut b = String::new();
        s.read_to_string(&mut b)?;
        Ok::<_, std::io::Error>(b)
    });
    assert!(quit.unwrap().starts_with("HTTP/1.1 200"));
    let status = wait_for(
        "the agent to exit after /quitquitquit",
        Duration::from_secs(10),
        || {
            if pod.agent.alive() {
                None
            } else {
                pod.agent.terminate(Duration::from_secs(1))
            }
        },
    );
    assert!(status.success(), "{}", pod.agent.log());
}

#[test]
fn wait_times_out_with_istios_exit_code() {
    let out = std::process::Command::new(tests::bin("pilot-agent"))
        .args([
            "wait",
            "--timeoutSeconds",
            "1",
            "--periodMillis",
            "200",
            "--url",
            "http://127.0.0.1:1/healthz/ready",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("timeout waiting for Envoy proxy to become ready. Last error:"),
        "{err}"
    );
}
