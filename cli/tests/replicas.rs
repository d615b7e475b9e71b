//! Several `mollm serve` replicas behind an existing router (nginx from Debian, on 127.0.0.1):
//! 32 concurrent chats through it all answered, both replicas serving; one replica drained
//! with SIGTERM in the middle of a burst answers 503 to what it has not admitted, nginx sends
//! those to the other, and no request is lost. Skips (saying so) where nginx is not installed,
//! unless MOLLM_REQUIRE_NGINX=1 (CI, after scripts/install-nginx.sh).

mod common;

use common::{model, SMOLLM2};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `mollm serve` on a free port; its address once the model is loaded.
fn replica(m: &str) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args([
            "serve",
            "-m",
            m,
            "--port",
            "0",
            "-t",
            "1",
            "--parallel",
            "4",
        ])
        .args(["--shutdown-grace", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("mollm serve did not start");
        if let Some(rest) = line.split("ready on http://").nth(1) {
            let addr = rest.split([':', ' ']).take(2).collect::<Vec<_>>().join(":");
            // Keep draining its log so it never blocks on a full pipe.
            std::thread::spawn(move || for _ in rx {});
            return (Proc(child), addr);
        }
    }
}

/// One HTTP/1.1 request: (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, "connection refused".into());
    };
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn chats_through(addr: &str, n: usize, max_tokens: usize) -> Vec<(u16, String)> {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let body = format!(
                    r#"{{"messages": [{{"role": "user", "content": "Count to {i}."}}], "max_tokens": {max_tokens}, "ignore_eos": true}}"#
                );
                http(&addr, "POST", "/v1/chat/completions", &body)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn served(addr: &str) -> f64 {
    let (_, m) = http(addr, "GET", "/metrics", "");
    m.lines()
        .filter(|l| {
            l.starts_with("mollm:requests_total{route=\"/v1/chat/completions\",status=\"200\"}")
        })
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn two_replicas_behind_nginx_lose_no_request() {
    let Some(m) = model(SMOLLM2) else { return };
    if Command::new("nginx").arg("-v").output().is_err() {
        assert!(
            !abi::settings::REQUIRE_NGINX.on(false),
            "nginx is required (MOLLM_REQUIRE_NGINX=1) but not installed"
        );
        eprintln!("SKIPPED: nginx is not installed (scripts/install-nginx.sh)");
        return;
    }
    let m = m.to_str().unwrap();
    let (mut a, a_addr) = replica(m);
    let (_b, b_addr) = replica(m);
    let dir = common::scratch_sub("nginx");
    let port = free_port();
    let conf = format!(
        r#"worker_processes 1;
daemon off;
master_process off;
error_log {d}/error.log;
pid {d}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  upstream mollm {{
    least_conn;
    server {a_addr} max_fails=0;
    server {b_addr} max_fails=0;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://mollm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
      # A draining replica's 503 means the request was never admitted: safe to resend.
      proxy_next_upstream error timeout http_503 non_idempotent;
    }}
  }}
}}
"#,
        d = dir.display()
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let _nginx = Proc(
        Command::new("nginx")
            .args([
                "-c",
                conf_path.to_str().unwrap(),
                "-p",
                dir.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let front = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http(&front, "GET", "/health", "").0 != 200 {
        assert!(Instant::now() < deadline, "nginx did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }

    // 32 concurrent chats: every one answered, by both replicas.
    let answers = chats_through(&front, 32, 16);
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert!(body.contains("\"choices\""), "{body}");
    }
    let (sa, sb) = (served(&a_addr), served(&b_addr));
    assert_eq!(sa + sb, 32.0, "{sa} + {sb}");
    assert!(
        sa > 0.0 && sb > 0.0,
        "one replica took everything: {sa} + {sb}"
    );

    // Drain replica a in the middle of a burst: nothing is lost.
    let burst = {
        let front = front.clone();
        std::thread::spawn(move || chats_through(&front, 32, 96))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !burst.is_finished(),
        "the burst ended before the drain: make it longer"
    );
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(a.0.id() as i32, libc::SIGTERM);
    }
    for (status, body) in burst.join().unwrap() {
        assert_eq!(
            status, 200,
            "a request was lost while a replica drained: {body}"
        );
    }
    let exited = a.0.wait().unwrap();
    assert!(exited.success(), "the drained replica exited with {exited}");
}
