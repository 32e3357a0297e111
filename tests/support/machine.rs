//! The process inside every test image: a tiny static program, compiled by
//! the test harness itself (`rustc -C target-feature=+crt-static`), so that
//! the Docker tests need nothing but the Rust toolchain and the engine: no
//! registry, no busybox.
//!
//! It is not part of any cargo target; `images.rs` compiles it.
//!
//! ```text
//! machine run [--ignore-term] [--exit-after SECONDS] [--exit-code N]
//!     sleep until SIGTERM (exit 0 at once), or ignore SIGTERM and wait to
//!     be killed (as a node that takes its whole grace period to stop);
//!     optionally exit by itself after SECONDS with code N (default 0);
//!     SIGUSR1 makes it exit by itself at once with code 7 (a crash)
//! machine exit N      exit at once with code N (an image that crashes)
//! machine true        exit 0 (a passing health check)
//! ```

use std::time::Duration;

const SIGUSR1: i32 = 10;
const SIGTERM: i32 = 15;
const SIG_IGN: usize = 1;

unsafe extern "C" {
    // Both are in the C library every Rust program on Linux links; the
    // static build carries them.
    fn signal(signum: i32, handler: usize) -> usize;
    fn _exit(code: i32) -> !;
}

extern "C" fn exit_on_term(_: i32) {
    // Only async-signal-safe calls in a handler: _exit, not process::exit.
    unsafe { _exit(0) }
}

extern "C" fn crash(_: i32) {
    unsafe { _exit(7) }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    match arg(0) {
        Some("exit") => std::process::exit(arg(1).and_then(|c| c.parse().ok()).unwrap_or(1)),
        Some("true") => std::process::exit(0),
        Some("run") | None => run(&args),
        Some(other) => {
            eprintln!("machine: unknown command {other:?}");
            std::process::exit(64)
        }
    }
}

fn run(args: &[String]) {
    let flag = |name: &str| args.iter().position(|a| a == name);
    let value = |name: &str| flag(name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<u64>().ok());
    let handler = if flag("--ignore-term").is_some() { SIG_IGN } else { exit_on_term as *const () as usize };
    unsafe {
        signal(SIGTERM, handler);
        signal(SIGUSR1, crash as *const () as usize);
    }
    match value("--exit-after") {
        Some(secs) => {
            std::thread::sleep(Duration::from_secs(secs));
            let code = value("--exit-code").unwrap_or(0);
            std::process::exit(i32::try_from(code).unwrap_or(1))
        }
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
}
