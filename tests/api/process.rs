//! drover as a separate process of the real binary, for crash tests.

use std::time::Duration;

pub struct Process {
    child: std::process::Child,
    pub addr: String,
}

impl Process {
    pub fn spawn(data_dir: &std::path::Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--stop-timeout", "2s", "--log-level", "warn"])
            .arg("--data-dir")
            .arg(data_dir)
            .spawn()
            .expect("starting drover");
        Self { child, addr: format!("http://127.0.0.1:{port}") }
    }

    pub async fn wait_up(&self) {
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if client.get(format!("{}/healthz", self.addr)).send().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("drover did not come up at {}", self.addr);
    }

    /// SIGKILL: no graceful anything.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
