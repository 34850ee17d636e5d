//! `file-list`: a directory's entries, for corral's `Sandbox::list_dir`.
//!
//! The output is binary-safe: every entry is ten fields, each ended by a
//! NUL byte (which no file name or link target can contain):
//!
//! ```text
//! TYPE \0 SIZE \0 MODE \0 NAME \0 TARGET \0 MTIME \0 UID \0 GID \0 OWNER \0 GROUP \0
//! ```
//!
//! TYPE is `file`, `dir`, `symlink` or `other`; SIZE the decimal size in
//! bytes (of the link itself for a symlink); MODE the permission bits in
//! octal (e.g. `755`); NAME the entry's name as stored on disk (any bytes
//! but `/` and NUL); TARGET a symlink's target as stored, empty for other
//! types; MTIME the last modification as `SECONDS.NANOSECONDS` since the
//! epoch (seconds may be negative); UID and GID the numeric owner and
//! group; OWNER and GROUP their names in the sandbox's own `/etc/passwd`
//! and `/etc/group` (read as files, no name service), empty when not
//! named there. Entries are sorted by name (bytewise); `.` and `..` are left out.
//! Entries are described with `lstat`, so symlinks are reported, never
//! followed; the listed directory itself may be reached through symlinks,
//! checked against `--root` like every file command. The whole listing is
//! built and measured before a byte is printed: above `--max` it is refused
//! (a `too_large` failure), never cut.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::files::{resolve, Fail, FileRequest};

/// `file-list`: the entries of the directory `req.path`, written to `out`.
pub fn list(req: &FileRequest, out: &mut impl Write) -> Result<(), Fail> {
    let r = resolve(&req.path, req.root.as_deref())?;
    let meta = fs::metadata(&r.path).map_err(|e| Fail::io("list", &r.path, &e))?;
    if !meta.is_dir() {
        return Err(Fail::other(format!(
            "cannot list {:?}: not a directory",
            r.path
        )));
    }
    let listing = render(&r.path)?;
    if listing.len() as u64 > req.max {
        return Err(Fail::too_large(
            &r.path,
            &format!("the listing of {:?}", r.path),
            Some(listing.len() as u64),
            req.max,
        ));
    }
    out.write_all(&listing)
        .and_then(|()| out.flush())
        .map_err(|e| Fail::other(format!("cannot send the listing of {:?}: {e}", r.path)))
}

/// The encoded listing of `dir`.
fn render(dir: &Path) -> Result<Vec<u8>, Fail> {
    let read = fs::read_dir(dir).map_err(|e| Fail::io("list", dir, &e))?;
    let users = names("/etc/passwd");
    let groups = names("/etc/group");
    let mut entries = Vec::new();
    for entry in read {
        let entry = entry.map_err(|e| Fail::io("list", dir, &e))?;
        let name = entry.file_name();
        let path = entry.path();
        // An entry removed since the directory was read is simply not there.
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Fail::io("describe", &path, &e)),
        };
        let ft = meta.file_type();
        let (kind, target) = if ft.is_symlink() {
            let target = match fs::read_link(&path) {
                Ok(t) => t.into_os_string(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Fail::io("read the link", &path, &e)),
            };
            ("symlink", target)
        } else if ft.is_dir() {
            ("dir", Default::default())
        } else if ft.is_file() {
            ("file", Default::default())
        } else {
            ("other", Default::default())
        };
        entries.push((
            name,
            kind,
            meta.len(),
            meta.permissions().mode() & 0o7777,
            target,
            format!("{}.{:09}", meta.mtime(), meta.mtime_nsec()),
            meta.uid(),
            meta.gid(),
        ));
    }
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut buf = Vec::new();
    let name_of = |map: &HashMap<u32, Vec<u8>>, id: u32| map.get(&id).cloned().unwrap_or_default();
    for (name, kind, size, mode, target, mtime, uid, gid) in &entries {
        for field in [
            kind.as_bytes(),
            size.to_string().as_bytes(),
            format!("{mode:o}").as_bytes(),
            name.as_bytes(),
            target.as_bytes(),
            mtime.as_bytes(),
            uid.to_string().as_bytes(),
            gid.to_string().as_bytes(),
            &name_of(&users, *uid),
            &name_of(&groups, *gid),
        ] {
            buf.extend_from_slice(field);
            buf.push(0);
        }
    }
    Ok(buf)
}

/// Names by id from a `passwd`- or `group`-format file (`NAME:x:ID:...`):
/// the first line naming an id wins, as with the C library's files
/// backend. A missing or unreadable file names nobody.
fn names(file: &str) -> HashMap<u32, Vec<u8>> {
    parse_names(&fs::read(file).unwrap_or_default())
}

fn parse_names(text: &[u8]) -> HashMap<u32, Vec<u8>> {
    let mut out = HashMap::new();
    for line in text.split(|b| *b == b'\n') {
        let mut fields = line.split(|b| *b == b':');
        let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let id = std::str::from_utf8(id)
            .ok()
            .and_then(|i| i.trim().parse::<u32>().ok());
        if let (Some(id), false) = (id, name.is_empty() || name.contains(&0)) {
            out.entry(id).or_insert_with(|| name.to_vec());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::{req, TempDir};
    use crate::files::Op;
    use corral_core::file_error::FileErrorKind;

    fn fields(out: &[u8]) -> Vec<Vec<String>> {
        assert_eq!(out.last(), Some(&0), "ends with a NUL: {out:?}");
        let parts: Vec<String> = out[..out.len() - 1]
            .split(|b| *b == 0)
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect();
        assert_eq!(parts.len() % 10, 0, "ten fields per entry: {parts:?}");
        parts.chunks(10).map(<[String]>::to_vec).collect()
    }

    #[test]
    fn lists_sorted_entries_with_type_size_mode_and_target() {
        let t = TempDir::new("list");
        fs::write(t.0.join("b.txt"), b"hello").expect("write");
        fs::set_permissions(t.0.join("b.txt"), fs::Permissions::from_mode(0o640)).expect("chmod");
        fs::create_dir(t.0.join("a-dir")).expect("mkdir");
        fs::set_permissions(t.0.join("a-dir"), fs::Permissions::from_mode(0o750)).expect("chmod");
        std::os::unix::fs::symlink("b.txt", t.0.join("c-link")).expect("symlink");
        std::os::unix::fs::symlink("/nowhere", t.0.join("d-dangling")).expect("symlink");
        // Names with the separators of other formats.
        fs::write(t.0.join("new\nline\ttab"), b"").expect("write");

        let mut out = Vec::new();
        list(&req(Op::List, &t.s(), None), &mut out).expect("list");
        let got = fields(&out);
        let row = |k: &str, s: &str, m: &str, n: &str, tg: &str| -> Vec<String> {
            [k, s, m, n, tg].iter().map(|x| x.to_string()).collect()
        };
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(
            (got[0][0].as_str(), got[0][2].as_str(), got[0][3].as_str()),
            ("dir", "750", "a-dir")
        );
        assert_eq!(got[0][4], "");
        assert_eq!(got[1][..5], row("file", "5", "640", "b.txt", ""));
        // Time and ownership as lstat says, the names from /etc/passwd.
        let meta = fs::symlink_metadata(t.0.join("b.txt")).expect("stat");
        assert_eq!(
            got[1][5],
            format!("{}.{:09}", meta.mtime(), meta.mtime_nsec())
        );
        assert_eq!(got[1][6], meta.uid().to_string());
        assert_eq!(got[1][7], meta.gid().to_string());
        let users = names("/etc/passwd");
        assert_eq!(
            got[1][8].as_bytes(),
            users.get(&meta.uid()).map_or(&[][..], Vec::as_slice)
        );
        assert_eq!(got[2][0], "symlink");
        assert_eq!(
            (got[2][3].as_str(), got[2][4].as_str()),
            ("c-link", "b.txt")
        );
        assert_eq!(got[2][1], "5", "size of the link itself");
        assert_eq!(
            (got[3][0].as_str(), got[3][3].as_str(), got[3][4].as_str()),
            ("symlink", "d-dangling", "/nowhere")
        );
        assert_eq!(got[4][3], "new\nline\ttab");
    }

    #[test]
    fn names_come_from_the_first_line_of_an_id() {
        let map = parse_names(
            b"root:x:0:0:root:/root:/bin/sh\n# comment\n\nuser:x:1000:1000::/home/user:/bin/sh\n\
              again:x:1000:1000::/:/bin/sh\nbad:x:nan:0\n:x:5:5\nshort:x\n",
        );
        assert_eq!(map.get(&0).map(Vec::as_slice), Some(&b"root"[..]));
        assert_eq!(map.get(&1000).map(Vec::as_slice), Some(&b"user"[..]));
        assert_eq!(map.len(), 2, "{map:?}");
        assert!(parse_names(b"").is_empty());
    }

    #[test]
    fn an_empty_directory_prints_nothing() {
        let t = TempDir::new("list-empty");
        let mut out = Vec::new();
        list(&req(Op::List, &t.s(), None), &mut out).expect("list");
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn errors_are_typed_and_name_the_path() {
        let t = TempDir::new("list-err");
        fs::write(t.0.join("f"), b"x").expect("write");
        fs::create_dir(t.0.join("root")).expect("mkdir");
        let file = t.0.join("f").display().to_string();
        let e = list(&req(Op::List, &file, None), &mut Vec::new()).expect_err("a file");
        assert_eq!(e.report.kind, FileErrorKind::Io);
        assert!(e.report.message.contains("not a directory"), "{e:?}");
        assert!(
            e.report.message.contains(&format!("{:?}", t.0.join("f"))),
            "{e:?}"
        );

        let missing = t.0.join("missing").display().to_string();
        let e = list(&req(Op::List, &missing, None), &mut Vec::new()).expect_err("missing");
        assert_eq!(e.report.kind, FileErrorKind::NotFound);

        let root = t.0.join("root").display().to_string();
        let e = list(&req(Op::List, "..", Some(&root)), &mut Vec::new()).expect_err("escape");
        assert_eq!(e.report.kind, FileErrorKind::Escapes);
        // Relative paths under the root work.
        let mut out = Vec::new();
        list(&req(Op::List, ".", Some(&root)), &mut out).expect("root itself");
        assert!(out.is_empty());
    }

    #[test]
    fn a_listing_above_the_cap_prints_nothing() {
        let t = TempDir::new("list-cap");
        for i in 0..10 {
            fs::write(t.0.join(format!("file-{i}")), b"").expect("write");
        }
        let mut r = req(Op::List, &t.s(), None);
        r.max = 20;
        let mut out = Vec::new();
        let e = list(&r, &mut out).expect_err("too large");
        assert_eq!(e.report.kind, FileErrorKind::TooLarge);
        assert!(
            e.report.message.contains("above the cap of 20 bytes"),
            "{e:?}"
        );
        assert!(out.is_empty());
    }
}
