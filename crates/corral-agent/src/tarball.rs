//! `tar-extract` and `tar-create`: directory trees in and out of a sandbox
//! as tar streams.
//!
//! Extraction reads the whole archive first (at most `--max` bytes, held in
//! memory) and checks every entry before it writes anything: a path that is
//! absolute or climbs with `..`, a link whose target leaves the directory, a
//! device or FIFO, or a sparse file (which could expand far past the
//! archive's size) rejects the archive and leaves the disk as it was. While
//! writing, each entry's parent directories are resolved again on disk, so a
//! symlink that already sits in the directory cannot carry a write outside
//! it either. Files are written like `file-write` (temporary file, rename),
//! with their mode minus setuid/setgid/sticky bits, and their mtime.
//!
//! Creation walks the tree once, measures the exact archive with a dry run
//! (so a refused tree sends no bytes), then streams it. Symlinks are stored
//! as links, never followed; sockets, FIFOs and devices are left out.

use std::fs::{self, DirBuilder};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use tar::{Archive, Builder, EntryType, Header, HeaderMode};

use crate::files::{
    canonicalize_prefix, copy_capped, make_dirs, open_read, resolve, write_atomic, CopyError, Fail,
    FileRequest,
};

/// `tar-extract`: the tar on `input` into `req.path` (created if missing).
pub fn extract(req: &FileRequest, input: &mut impl Read) -> Result<(), Fail> {
    let r = resolve(&req.path, req.root.as_deref())?;
    let mut data = Vec::new();
    copy_capped(input, &mut data, req.max).map_err(|e| match e {
        CopyError::TooLarge => Fail::too_large(
            &r.path,
            &format!("the archive for {:?}", r.path),
            None,
            req.max,
        ),
        CopyError::Read(e) | CopyError::Write(e) => {
            Fail::other(format!("cannot read the archive for {:?}: {e}", r.path))
        }
    })?;
    check(&data, &r.path)?;
    make_dirs(&r.path)?;
    let base = fs::canonicalize(&r.path).map_err(|e| Fail::io("extract into", &r.path, &e))?;
    unpack(&data, &base, req.max)
}

fn bad_archive(e: io::Error) -> Fail {
    Fail::other(format!("invalid tar archive: {e}"))
}

/// An entry's path relative to the extraction directory, `.` components
/// dropped; `None` for the directory itself (`.`, `./`).
fn entry_path(raw: &Path) -> Result<Option<PathBuf>, Fail> {
    let mut rel = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => rel.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(Fail::unsafe_entry(raw, "a '..' component")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(Fail::unsafe_entry(raw, "an absolute path"))
            }
        }
    }
    Ok((!rel.as_os_str().is_empty()).then_some(rel))
}

/// Whether symlink `target`, placed at `rel` inside `base`, stays inside
/// `base` by its text alone (the on-disk check comes when it is created).
fn link_stays_inside(base: &Path, rel: &Path, target: &Path) -> bool {
    if target.as_os_str().is_empty() {
        return false;
    }
    if target.is_absolute() {
        let mut p = PathBuf::new();
        for c in target.components() {
            match c {
                Component::ParentDir => {
                    p.pop();
                }
                Component::CurDir => {}
                c => p.push(c),
            }
        }
        return p.starts_with(base);
    }
    let mut depth = rel.parent().map_or(0, |p| p.components().count());
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir if depth == 0 => return false,
            Component::ParentDir => depth -= 1,
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// The link target of a link entry.
fn link_target(entry: &tar::Entry<'_, &[u8]>, raw: &Path) -> Result<PathBuf, Fail> {
    match entry.link_name() {
        Ok(Some(t)) => Ok(t.into_owned()),
        Ok(None) => Err(Fail::unsafe_entry(raw, "a link without a target")),
        Err(e) => Err(bad_archive(e)),
    }
}

/// Pass one: every entry is safe and the archive is whole, or nothing is
/// written at all.
fn check(data: &[u8], base: &Path) -> Result<(), Fail> {
    let mut archive = Archive::new(data);
    for entry in archive.entries().map_err(bad_archive)? {
        let mut entry = entry.map_err(bad_archive)?;
        let raw = entry.path().map_err(bad_archive)?.into_owned();
        let kind = entry.header().entry_type();
        let rel = entry_path(&raw)?;
        match (kind, &rel) {
            (EntryType::XGlobalHeader, _) | (EntryType::Directory, None) => {}
            (_, None) => return Err(Fail::unsafe_entry(&raw, "names the directory itself")),
            (EntryType::Regular | EntryType::Continuous | EntryType::Directory, _) => {}
            (EntryType::Symlink, Some(rel)) => {
                let target = link_target(&entry, &raw)?;
                if !link_stays_inside(base, rel, &target) {
                    return Err(Fail::unsafe_entry(
                        &raw,
                        &format!("symbolic link to {target:?} points outside {base:?}"),
                    ));
                }
            }
            (EntryType::Link, _) => {
                let target = link_target(&entry, &raw)?;
                if entry_path(&target)?.is_none() {
                    return Err(Fail::unsafe_entry(
                        &raw,
                        "hard link to the directory itself",
                    ));
                }
            }
            (EntryType::GNUSparse, _) => {
                return Err(Fail::unsafe_entry(&raw, "sparse files are not supported"))
            }
            (other, _) => {
                return Err(Fail::unsafe_entry(
                    &raw,
                    &format!("unsupported entry type {other:?}"),
                ))
            }
        }
        // A truncated archive must fail here, not half-way through pass two.
        let size = entry.size();
        let read = io::copy(&mut entry, &mut io::sink()).map_err(bad_archive)?;
        if read != size {
            return Err(bad_archive(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("entry {raw:?} is truncated"),
            )));
        }
    }
    Ok(())
}

/// Walks `rel_dir` down from `base`, creating what is missing. An existing
/// symlink is followed only when it leads to a directory inside `base`.
fn enter_dirs(base: &Path, rel_dir: &Path, raw: &Path) -> Result<PathBuf, Fail> {
    let mut cur = base.to_path_buf();
    for c in rel_dir.components() {
        let next = cur.join(c);
        match fs::symlink_metadata(&next) {
            Ok(m) if m.is_dir() => cur = next,
            Ok(m) if m.file_type().is_symlink() => {
                let real = fs::canonicalize(&next).map_err(|e| Fail::io("extract", &next, &e))?;
                if !real.starts_with(base) {
                    return Err(Fail::unsafe_entry(
                        raw,
                        &format!("{next:?} is a symbolic link to {real:?}, outside {base:?}"),
                    ));
                }
                if !real.is_dir() {
                    return Err(Fail::other(format!(
                        "cannot extract {raw:?}: {next:?} is not a directory"
                    )));
                }
                cur = real;
            }
            Ok(_) => {
                return Err(Fail::other(format!(
                    "cannot extract {raw:?}: {next:?} is not a directory"
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                DirBuilder::new()
                    .mode(0o755)
                    .create(&next)
                    .map_err(|e| Fail::io("create directory", &next, &e))?;
                cur = next;
            }
            Err(e) => return Err(Fail::io("extract", &next, &e)),
        }
    }
    Ok(cur)
}

/// Makes room for a new non-directory at `dest`: a directory there is an
/// error, anything else is removed (never followed).
fn clear(dest: &Path, raw: &Path) -> Result<(), Fail> {
    match fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => Err(Fail::other(format!(
            "cannot extract {raw:?}: {dest:?} is a directory"
        ))),
        Ok(_) => fs::remove_file(dest).map_err(|e| Fail::io("replace", dest, &e)),
        Err(_) => Ok(()),
    }
}

/// Pass two: writes the checked entries under the canonical `base`.
fn unpack(data: &[u8], base: &Path, max: u64) -> Result<(), Fail> {
    // Applied last and deepest first, so a read-only directory still takes
    // its entries.
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut archive = Archive::new(data);
    for entry in archive.entries().map_err(bad_archive)? {
        let mut entry = entry.map_err(bad_archive)?;
        let raw = entry.path().map_err(bad_archive)?.into_owned();
        let kind = entry.header().entry_type();
        let Some(rel) = entry_path(&raw)? else {
            continue;
        };
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        if kind == EntryType::Directory {
            // The owner keeps full access, or the sandbox could not use it.
            dir_modes.push((enter_dirs(base, &rel, &raw)?, mode | 0o700));
            continue;
        }
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        let dir = enter_dirs(base, parent, &raw)?;
        let dest = dir.join(name);
        match kind {
            EntryType::Regular | EntryType::Continuous => {
                if fs::symlink_metadata(&dest).is_ok_and(|m| m.is_dir()) {
                    return Err(Fail::other(format!(
                        "cannot extract {raw:?}: {dest:?} is a directory"
                    )));
                }
                let mtime = entry
                    .header()
                    .mtime()
                    .ok()
                    .and_then(|s| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s)));
                let what = format!("entry {raw:?}");
                write_atomic(&dir, Path::new(name), &mut entry, mode, max, &what, mtime)?;
            }
            EntryType::Symlink => {
                let target = link_target(&entry, &raw)?;
                // Checked again where it really lands, through any symlink
                // already on disk.
                let lands = canonicalize_prefix(&dir.join(&target))
                    .map_err(|e| Fail::io("resolve the link target of", &dest, &e))?;
                if !lands.starts_with(base) {
                    return Err(Fail::unsafe_entry(
                        &raw,
                        &format!(
                            "symbolic link to {target:?} lands on {lands:?}, outside {base:?}"
                        ),
                    ));
                }
                clear(&dest, &raw)?;
                std::os::unix::fs::symlink(&target, &dest)
                    .map_err(|e| Fail::io("create symbolic link", &dest, &e))?;
            }
            EntryType::Link => {
                let target = link_target(&entry, &raw)?;
                let Some(target_rel) = entry_path(&target)? else {
                    return Err(Fail::unsafe_entry(
                        &raw,
                        "hard link to the directory itself",
                    ));
                };
                let source = fs::canonicalize(base.join(&target_rel))
                    .map_err(|e| Fail::io("resolve the hard link target of", &dest, &e))?;
                if !source.starts_with(base) || source.is_dir() {
                    return Err(Fail::unsafe_entry(
                        &raw,
                        &format!("hard link to {source:?}, not a file inside {base:?}"),
                    ));
                }
                clear(&dest, &raw)?;
                fs::hard_link(&source, &dest)
                    .map_err(|e| Fail::io("create hard link", &dest, &e))?;
            }
            // Global headers; everything else was refused by `check`.
            _ => {}
        }
    }
    for (dir, mode) in dir_modes.iter().rev() {
        fs::set_permissions(dir, fs::Permissions::from_mode(*mode))
            .map_err(|e| Fail::io("set the mode of", dir, &e))?;
    }
    Ok(())
}

/// One thing to archive.
struct Item {
    /// Its name in the archive.
    name: PathBuf,
    /// Where it is.
    path: PathBuf,
    meta: fs::Metadata,
    /// A symlink's target.
    link: Option<PathBuf>,
}

/// `tar-create`: `req.path` (a file, or a directory's contents) as a tar on
/// `out`, refused before any byte is sent when the archive would exceed the
/// cap.
pub fn create(req: &FileRequest, out: &mut impl Write) -> Result<(), Fail> {
    let r = resolve(&req.path, req.root.as_deref())?;
    let meta = fs::symlink_metadata(&r.path).map_err(|e| Fail::io("archive", &r.path, &e))?;
    let items = if meta.is_dir() {
        let mut items = Vec::new();
        walk(&r.path, &r.path, &mut items)?;
        items
    } else if meta.is_file() {
        let Some(name) = r.path.file_name() else {
            return Err(Fail::other(format!("cannot archive {:?}", r.path)));
        };
        vec![Item {
            name: PathBuf::from(name),
            path: r.path.clone(),
            meta,
            link: None,
        }]
    } else if meta.file_type().is_symlink() {
        return Err(Fail::not_found(
            &r.path,
            "a symbolic link to a missing target",
        ));
    } else {
        return Err(Fail::other(format!(
            "cannot archive {:?}: not a regular file or directory",
            r.path
        )));
    };
    let mut counter = Counter(0);
    write_archive(&mut counter, &items, false)?;
    if counter.0 > req.max {
        return Err(Fail::too_large(
            &r.path,
            &format!("the archive of {:?}", r.path),
            Some(counter.0),
            req.max,
        ));
    }
    write_archive(out, &items, true)
}

/// Collects `dir`'s tree, parents before children, names sorted.
fn walk(root: &Path, dir: &Path, items: &mut Vec<Item>) -> Result<(), Fail> {
    let mut children: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| Fail::io("list", dir, &e))?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()
        .map_err(|e| Fail::io("list", dir, &e))?;
    children.sort();
    for path in children {
        let meta = fs::symlink_metadata(&path).map_err(|e| Fail::io("archive", &path, &e))?;
        let Ok(name) = path.strip_prefix(root).map(Path::to_path_buf) else {
            continue;
        };
        let ft = meta.file_type();
        if ft.is_dir() {
            items.push(Item {
                name,
                path: path.clone(),
                meta,
                link: None,
            });
            walk(root, &path, items)?;
        } else if ft.is_file() {
            items.push(Item {
                name,
                path,
                meta,
                link: None,
            });
        } else if ft.is_symlink() {
            let link = fs::read_link(&path).map_err(|e| Fail::io("archive", &path, &e))?;
            items.push(Item {
                name,
                path,
                meta,
                link: Some(link),
            });
        }
    }
    Ok(())
}

/// Counts bytes: the dry run's sink.
struct Counter(u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len() as u64);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes the archive of `items`. The dry run (`real == false`) writes
/// zeros for file contents; the real one reads each file, sending exactly
/// the size measured (padded with zeros if it shrank), so the archive is
/// exactly as long as the dry run said.
fn write_archive(out: impl Write, items: &[Item], real: bool) -> Result<(), Fail> {
    let mut b = Builder::new(out);
    let send = |e: io::Error| Fail::other(format!("cannot send the archive: {e}"));
    for it in items {
        let mut h = Header::new_gnu();
        h.set_metadata_in_mode(&it.meta, HeaderMode::Complete);
        if let Some(target) = &it.link {
            b.append_link(&mut h, &it.name, target).map_err(send)?;
        } else if it.meta.is_dir() {
            b.append_data(&mut h, &it.name, io::empty()).map_err(send)?;
        } else {
            let size = it.meta.len();
            if real {
                let file = open_read(&it.path).map_err(|e| Fail::io("archive", &it.path, &e))?;
                let body = file.take(size).chain(io::repeat(0)).take(size);
                b.append_data(&mut h, &it.name, body).map_err(send)?;
            } else {
                b.append_data(&mut h, &it.name, io::repeat(0).take(size))
                    .map_err(send)?;
            }
        }
    }
    let mut out = b.into_inner().map_err(send)?;
    out.flush().map_err(send)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::{req, TempDir};
    use crate::files::Op;
    use corral_core::file_error::FileErrorKind;

    /// A tar with one entry per `(path, type, data or link target)`, headers
    /// written raw so hostile paths survive.
    fn raw_tar(entries: &[(&str, EntryType, &[u8])]) -> Vec<u8> {
        let mut b = Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let mut h = Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            {
                let name = &mut h.as_old_mut().name;
                name[..path.len()].copy_from_slice(path.as_bytes());
            }
            if matches!(kind, EntryType::Symlink | EntryType::Link) {
                h.set_size(0);
                let link = &mut h.as_old_mut().linkname;
                link[..data.len()].copy_from_slice(data);
                h.set_cksum();
                b.append(&h, io::empty()).expect("append");
            } else {
                h.set_size(data.len() as u64);
                h.set_cksum();
                b.append(&h, *data).expect("append");
            }
        }
        b.into_inner().expect("finish")
    }

    #[test]
    fn round_trips_a_tree() {
        let src = TempDir::new("tar-src");
        fs::create_dir_all(src.0.join("a/b")).expect("mkdir");
        let bin: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
        fs::write(src.0.join("a/b/bin"), &bin).expect("write");
        fs::write(src.0.join("top.txt"), b"top").expect("write");
        std::os::unix::fs::symlink("a/b/bin", src.0.join("link")).expect("symlink");

        let mut tar = Vec::new();
        create(&req(Op::TarCreate, &src.s(), None), &mut tar).expect("create");
        let dst = TempDir::new("tar-dst");
        let into = dst.0.join("new/dir").display().to_string();
        extract(&req(Op::TarExtract, &into, None), &mut &tar[..]).expect("extract");
        let into = PathBuf::from(into);
        assert_eq!(fs::read(into.join("a/b/bin")).expect("read"), bin);
        assert_eq!(fs::read(into.join("top.txt")).expect("read"), b"top");
        assert_eq!(
            fs::read_link(into.join("link")).expect("link"),
            Path::new("a/b/bin")
        );

        // The dry run measures exactly: a cap of the archive's length passes,
        // one byte less is refused with the size.
        let mut r = req(Op::TarCreate, &src.s(), None);
        r.max = tar.len() as u64;
        create(&r, &mut Vec::new()).expect("at the cap");
        r.max -= 1;
        let mut out = Vec::new();
        let e = create(&r, &mut out).expect_err("above the cap");
        assert_eq!(e.report.kind, FileErrorKind::TooLarge);
        assert!(
            e.report
                .message
                .contains(&format!("is {} bytes", tar.len())),
            "{e:?}"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn hostile_entries_are_refused_before_anything_is_written() {
        let cases: [(&str, EntryType, &[u8], &str); 6] = [
            ("../evil", EntryType::Regular, b"x", "'..'"),
            ("ok/../../evil", EntryType::Regular, b"x", "'..'"),
            ("/abs", EntryType::Regular, b"x", "absolute"),
            ("l", EntryType::Symlink, b"../outside", "points outside"),
            ("l", EntryType::Symlink, b"/etc", "points outside"),
            ("dev", EntryType::Fifo, b"", "unsupported"),
        ];
        for (path, kind, data, why) in cases {
            let t = TempDir::new("evil");
            let dest = t.0.join("dest");
            // A harmless entry first: it must not be written either.
            let tar = raw_tar(&[("first", EntryType::Regular, b"1"), (path, kind, data)]);
            let e = extract(
                &req(Op::TarExtract, &dest.display().to_string(), None),
                &mut &tar[..],
            )
            .expect_err(path);
            assert_eq!(e.report.kind, FileErrorKind::UnsafeEntry, "{path}: {e:?}");
            assert!(
                e.report
                    .message
                    .starts_with(&format!("unsafe entry {path:?}")),
                "{e:?}"
            );
            assert!(e.report.message.contains(why), "{e:?}");
            assert_eq!(e.report.entry.as_deref(), Some(path), "{e:?}");
            assert!(
                e.report.reason.as_deref().is_some_and(|r| r.contains(why)),
                "{e:?}"
            );
            assert!(!dest.exists(), "{path}: wrote before refusing");
            assert!(!t.0.join("evil").exists());
        }
    }

    #[test]
    fn existing_symlinks_cannot_carry_writes_outside() {
        let t = TempDir::new("carry");
        let dest = t.0.join("dest");
        fs::create_dir_all(&dest).expect("mkdir");
        fs::create_dir(t.0.join("outside")).expect("mkdir");
        std::os::unix::fs::symlink(t.0.join("outside"), dest.join("out")).expect("symlink");
        let tar = raw_tar(&[("out/evil", EntryType::Regular, b"x")]);
        let e = extract(
            &req(Op::TarExtract, &dest.display().to_string(), None),
            &mut &tar[..],
        )
        .expect_err("through a symlink");
        assert_eq!(e.report.kind, FileErrorKind::UnsafeEntry, "{e:?}");
        assert!(!t.0.join("outside/evil").exists());

        // A link chain the text check cannot see: `up` -> `.` makes `up/up/l`
        // sit at depth 0, where `../../x` leaves the directory.
        let tar = raw_tar(&[
            ("up", EntryType::Symlink, b"."),
            ("up/up/l", EntryType::Symlink, b"../../x"),
        ]);
        let e = extract(
            &req(Op::TarExtract, &dest.display().to_string(), None),
            &mut &tar[..],
        )
        .expect_err("link chain");
        assert_eq!(e.report.kind, FileErrorKind::UnsafeEntry, "{e:?}");
    }

    #[test]
    fn archive_size_is_capped() {
        let t = TempDir::new("cap");
        let tar = raw_tar(&[("f", EntryType::Regular, &[7u8; 2000])]);
        let mut r = req(Op::TarExtract, &t.s(), None);
        r.max = 1000;
        let e = extract(&r, &mut &tar[..]).expect_err("too large");
        assert_eq!(e.report.kind, FileErrorKind::TooLarge);
        assert!(!t.0.join("f").exists());
        // Truncated archives are refused whole.
        let e =
            extract(&req(Op::TarExtract, &t.s(), None), &mut &tar[..1000]).expect_err("truncated");
        assert_eq!(e.report.kind, FileErrorKind::Io, "{e:?}");
        assert!(!t.0.join("f").exists());
    }

    #[test]
    fn link_text_check() {
        let base = Path::new("/base");
        assert!(link_stays_inside(base, Path::new("a/l"), Path::new("../b")));
        assert!(!link_stays_inside(
            base,
            Path::new("a/l"),
            Path::new("../../b")
        ));
        assert!(link_stays_inside(
            base,
            Path::new("l"),
            Path::new("/base/x")
        ));
        assert!(!link_stays_inside(
            base,
            Path::new("l"),
            Path::new("/base/../etc")
        ));
        assert!(!link_stays_inside(
            base,
            Path::new("l"),
            Path::new("/basement")
        ));
        assert!(!link_stays_inside(base, Path::new("l"), Path::new("")));
    }
}
