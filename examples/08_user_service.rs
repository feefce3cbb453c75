//! Your own model behind coexec's HTTP service, in your own axum app, with
//! your own metrics recorder.
//!
//! The model measures great-circle routes: a request's inputs are JSON
//! objects of your type (`{"from": {"lat": …, "lon": …}, "to": {…}}`), its
//! answers are of your output type (`{"km": …, "bearing_deg": …}`), batched
//! and co-executed like any job. coexec's router (`/v1/infer`, `/healthz`,
//! `/readyz`) sits beside your routes; the app installs the Prometheus
//! recorder it wants and serves `/metrics` itself, and the service's
//! metrics land in it. Served on loopback, asked three times, drained.
//!
//! `cargo run --release -p coexec-serve --example 08_user_service`

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
use coexec::stream::{Model, StreamConfig};
use coexec_serve::{ServeConfig, ServeModel, Service};
use serde::{Deserialize, Serialize};

/// A point on the Earth, in degrees.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Point {
    lat: f64,
    lon: f64,
}

/// One request input: a route.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Route {
    from: Point,
    to: Point,
}

/// One answer: the route's length and initial bearing.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Leg {
    km: f64,
    bearing_deg: f64,
}

const EARTH_RADIUS_KM: f64 = 6371.0088;

impl Route {
    /// Haversine distance and initial bearing.
    fn leg(&self) -> Leg {
        let (p1, p2) = (self.from.lat.to_radians(), self.to.lat.to_radians());
        let dl = (self.to.lon - self.from.lon).to_radians();
        let a = ((p2 - p1) / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
        let km = 2.0 * EARTH_RADIUS_KM * a.sqrt().min(1.0).asin();
        let y = dl.sin() * p2.cos();
        let x = p1.cos() * p2.sin() - p1.sin() * p2.cos() * dl.cos();
        let bearing_deg = (y.atan2(x).to_degrees() + 360.0) % 360.0;
        Leg { km, bearing_deg }
    }
}

/// A batch of routes: item `i` writes the leg of route `i`.
struct Legs {
    routes: Vec<Route>,
    out: DisjointBuf<Leg>,
}

impl Kernel for Legs {
    fn name(&self) -> &str {
        "legs"
    }

    fn items(&self) -> usize {
        self.routes.len()
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        for (o, r) in self
            .out
            .chunk_mut(chunk)
            .iter_mut()
            .zip(&self.routes[chunk.range()])
        {
            *o = r.leg();
        }
        Ok(())
    }
}

/// The model: routes in, legs out.
struct Distances;

impl Model for Distances {
    type Input = Route;
    type Output = Leg;
    type Kernel = Legs;

    fn build(&self, routes: Vec<Route>) -> Result<Legs, KernelError> {
        let out = DisjointBuf::new(routes.len(), 1);
        Ok(Legs { routes, out })
    }

    fn outputs(&self, k: Legs) -> Result<Vec<Leg>, KernelError> {
        Ok(k.out.into_vec())
    }

    /// Refused before it is queued: the request gets a 400 naming it.
    fn check_input(&self, r: &Route) -> Result<(), String> {
        for (end, p) in [("from", r.from), ("to", r.to)] {
            if !(-90.0..=90.0).contains(&p.lat) || !(-180.0..=180.0).contains(&p.lon) {
                return Err(format!(
                    "`{end}` ({}, {}) is not a latitude in [-90, 90] and a longitude in [-180, 180]",
                    p.lat, p.lon
                ));
            }
        }
        Ok(())
    }
}

/// The JSON shape comes from `Route` and `Leg`; this adds what a 400 says.
impl ServeModel for Distances {
    fn describe_input(&self) -> String {
        r#"{"from": {"lat": degrees, "lon": degrees}, "to": {...}}"#.into()
    }
}

/// One HTTP/1.1 request on a fresh connection: the status line and body.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text.lines().next().unwrap_or("").to_string();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(format!("{status}\n  {}", body.trim_end()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Your recorder, your buckets: the service records into whatever the
    // application installed.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let prometheus = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    // A histogram holds its samples until the recorder's upkeep drains
    // them: every second, as coexec's own recorder does.
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            upkeep.run_upkeep();
        }
    });

    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:2")?
            .in_memory_profiles()
            .start()
            .await?,
    );
    let stream = StreamConfig::new()
        .max_batch(256)
        .max_wait(Duration::from_micros(200));
    let svc = Service::start(rt, Distances, stream, ServeConfig::new())?;

    let app = axum::Router::new()
        .route("/", get(|| async { "routes: POST /v1/infer\n" }))
        .route("/metrics", get(move || async move { prometheus.render() }))
        .merge(svc.router());
    let listener = coexec_serve::bind("127.0.0.1:0".parse()?).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(coexec_serve::serve(listener, app, async {
        let _ = stopped.await;
    }));

    let asked = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<String>> {
        let paris_tokyo = r#"{"from": {"lat": 48.8566, "lon": 2.3522}, "to": {"lat": 35.6762, "lon": 139.6503}}"#;
        let quito_nairobi = r#"{"from": {"lat": -0.1807, "lon": -78.4678}, "to": {"lat": -1.2921, "lon": 36.8219}}"#;
        let off_the_map = r#"{"from": {"lat": 100, "lon": 0}, "to": {"lat": 0, "lon": 0}}"#;
        Ok(vec![
            http(addr, "POST", "/v1/infer", &format!(r#"{{"inputs": [{paris_tokyo}, {quito_nairobi}]}}"#))?,
            http(addr, "POST", "/v1/infer", &format!(r#"{{"inputs": [{off_the_map}]}}"#))?,
            http(addr, "GET", "/metrics", "")?,
        ])
    })
    .await??;
    println!("POST /v1/infer (two routes) -> {}", asked[0]);
    println!("POST /v1/infer (off the map) -> {}", asked[1]);
    let counted: Vec<&str> = asked[2]
        .lines()
        .filter(|l| l.starts_with("coexec_requests_total") && !l.ends_with(" 0"))
        .collect();
    println!("GET /metrics (your recorder) -> {counted:?}");

    let _ = stop.send(());
    server.await?;
    svc.shutdown().await;
    Ok(())
}
