//! What the numbers were measured on: host, kernel, CPU, memory.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    /// `uname -srm`, e.g. "Linux 6.8.0 x86_64".
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_bytes: u64,
}

impl Machine {
    /// Describe this machine; anything unreadable is left empty or 0.
    pub fn this() -> Machine {
        let (hostname, kernel) = uname();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            hostname,
            kernel,
            cpu_model: cpu_model(&cpuinfo),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_bytes: Machine::memory(),
        }
    }

    /// This machine's memory in bytes (0 if unreadable), without the rest.
    pub fn memory() -> u64 {
        memory_bytes(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
    }

    /// "host: 2 × Intel(R) Xeon(R) ..., 24.0 GiB, Linux 6.8.0 x86_64".
    pub fn describe(&self) -> String {
        format!(
            "{}: {} × {}, {:.1} GiB, {}",
            self.hostname,
            self.cpus,
            self.cpu_model,
            self.memory_bytes as f64 / f64::from(1u32 << 30),
            self.kernel
        )
    }
}

fn uname() -> (String, String) {
    // SAFETY: utsname is plain old data; uname fills it or fails.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is a valid, writable utsname.
    if unsafe { libc::uname(&mut name) } != 0 {
        return (String::new(), String::new());
    }
    let text = |field: &[libc::c_char]| {
        let bytes: Vec<u8> = field
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let kernel = format!(
        "{} {} {}",
        text(&name.sysname),
        text(&name.release),
        text(&name.machine)
    );
    (text(&name.nodename), kernel)
}

fn cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, model)| model.trim().to_string())
        .unwrap_or_default()
}

fn memory_bytes(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .find(|line| line.starts_with("MemTotal:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: Test CPU @ 3GHz\n"),
            "Test CPU @ 3GHz"
        );
        assert_eq!(memory_bytes("MemTotal:       1024 kB\n"), 1 << 20);
        assert_eq!(memory_bytes(""), 0);
        let this = Machine::this();
        assert!(this.cpus > 0);
        assert!(this.describe().contains('×'));
    }
}
