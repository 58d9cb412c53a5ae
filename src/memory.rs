//! How much memory this broker may use: the limit of its cgroup when it runs in one with a
//! limit (a container, a systemd unit with `MemoryMax=`), else the machine's physical memory.
//! Budgets that grow with load (the segment cache's ceiling) stay within a share of it, so a
//! broker in a small container does not grow a cache its limit cannot hold.
//!
//! Read once at start. Both cgroup versions are understood: v2's `memory.max` and v1's
//! `memory.limit_in_bytes`, of the broker's own cgroup (from `/proc/self/cgroup`) and of every
//! ancestor up to the mount's root (a limit on an ancestor binds too); a path that is not
//! visible (another cgroup namespace) is skipped. The smallest limit found wins, and so does
//! physical memory when it is smaller (v1 writes "no limit" as a huge number).

use std::path::{Path, PathBuf};

/// The memory this broker may use, in bytes; `None` when neither a cgroup limit nor the
/// machine's memory can be read (not Linux, `/proc` not mounted).
pub fn limit() -> Option<u64> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let cgroups = read(Path::new("/proc/self/cgroup")).unwrap_or_default();
    let meminfo = read(Path::new("/proc/meminfo")).unwrap_or_default();
    limit_from(&cgroups, &meminfo, Path::new("/sys/fs/cgroup"), read)
}

/// [`limit`] from the text of `/proc/self/cgroup` and `/proc/meminfo`, reading limit files
/// under `root` (the cgroup mount) through `read`.
fn limit_from(
    cgroups: &str,
    meminfo: &str,
    root: &Path,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let mut found: Vec<u64> = Vec::new();
    for line in cgroups.lines() {
        // `hierarchy-id:controllers:path`; v2's line is `0::path`.
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (dir, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        for at in ancestors(&dir, path) {
            if let Some(bytes) = read(&at.join(file)).as_deref().and_then(parse_limit) {
                found.push(bytes);
            }
        }
    }
    found.extend(mem_total(meminfo));
    found.into_iter().min()
}

/// `dir` joined with `path` and with each of its ancestors, the deepest first, `dir` last.
fn ancestors(dir: &Path, path: &str) -> Vec<PathBuf> {
    dir.join(path.trim_start_matches('/'))
        .ancestors()
        .take_while(|at| at.starts_with(dir))
        .map(Path::to_path_buf)
        .collect()
}

/// A limit file's content: bytes, or `None` for v2's `max` (no limit) and anything unreadable.
fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MEMINFO: &str = "MemTotal:       24683784 kB\nMemFree:  1000 kB\n";
    const PHYSICAL: u64 = 24_683_784 * 1024;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(p, v)| (PathBuf::from(p), v.to_string()))
            .collect();
        move |p: &Path| map.get(p).cloned()
    }

    #[test]
    fn a_v2_limit_on_the_brokers_cgroup_or_an_ancestor_binds() {
        let root = Path::new("/sys/fs/cgroup");
        let own = files(&[
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/app/broker/memory.max", "268435456\n"),
        ]);
        assert_eq!(
            limit_from("0::/app/broker\n", MEMINFO, root, own),
            Some(256 << 20)
        );
        let ancestor = files(&[
            ("/sys/fs/cgroup/app/memory.max", "536870912\n"),
            ("/sys/fs/cgroup/app/broker/memory.max", "max\n"),
        ]);
        assert_eq!(
            limit_from("0::/app/broker\n", MEMINFO, root, ancestor),
            Some(512 << 20)
        );
    }

    #[test]
    fn a_v1_memory_hierarchy_is_read_and_its_no_limit_loses_to_physical_memory() {
        let root = Path::new("/sys/fs/cgroup");
        let cgroups = "9:name=systemd:/\n4:memory:/unit/x\n3:cpu,cpuacct:/\n0::/\n";
        let limited = files(&[(
            "/sys/fs/cgroup/memory/unit/x/memory.limit_in_bytes",
            "1073741824\n",
        )]);
        assert_eq!(limit_from(cgroups, MEMINFO, root, limited), Some(1 << 30));
        // The broker's own path is not visible (another namespace); the mount's root says
        // "no limit" the v1 way.
        let unlimited = files(&[(
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        )]);
        assert_eq!(
            limit_from(cgroups, MEMINFO, root, unlimited),
            Some(PHYSICAL)
        );
    }

    #[test]
    fn without_cgroups_physical_memory_is_the_limit_and_without_proc_there_is_none() {
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(limit_from("", MEMINFO, root, files(&[])), Some(PHYSICAL));
        assert_eq!(limit_from("garbage", "", root, files(&[])), None);
    }

    #[test]
    fn ancestors_walk_up_to_the_mount_and_stop_there() {
        let dir = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(
            ancestors(dir, "/a/b"),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory/a/b"),
                PathBuf::from("/sys/fs/cgroup/memory/a"),
                PathBuf::from("/sys/fs/cgroup/memory"),
            ]
        );
        assert_eq!(
            ancestors(dir, "/"),
            vec![PathBuf::from("/sys/fs/cgroup/memory")]
        );
    }
}
