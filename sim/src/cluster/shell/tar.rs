//! `tar` in the stand-in shell: what `kubectl cp` runs in a container, `tar cf - PATH` to copy
//! out and `tar -xmf - -C DIR` to copy in, over POSIX ustar archives on stdout and stdin.

use super::{Files, Outcome, absolute, parent};

const BLOCK: usize = 512;

pub(super) fn run(args: &[String], stdin: &[u8], files: &mut Files) -> Outcome {
    let mut rest = args.iter().filter(|a| !a.starts_with("--"));
    let Some(mode) = rest.next() else {
        return Outcome::fail(2, "tar: no mode given (c or x)");
    };
    let rest: Vec<&String> = rest.collect();
    // The archive is always `-` (stdout or stdin), the operand right after the mode.
    if rest.first().map(|a| a.as_str()) != Some("-") || !mode.contains('f') {
        return Outcome::fail(2, "tar: the stand-in reads and writes archives on - only");
    }
    let operands = &rest[1..];
    if mode.contains('c') {
        create(operands, files)
    } else if mode.contains('x') {
        let into = match operands {
            [] => "/".to_owned(),
            [flag, dir] if flag.as_str() == "-C" => absolute(dir),
            _ => return Outcome::fail(2, "tar: extract takes only -C DIR"),
        };
        extract(stdin, &into, files)
    } else {
        Outcome::fail(2, format!("tar: unknown mode {mode}"))
    }
}

/// Archives each path (a file, or a directory with everything under it) under its name
/// without the leading `/`, as GNU tar does.
fn create(paths: &[&String], files: &Files) -> Outcome {
    let mut archive = Vec::new();
    let mut outcome = Outcome::default();
    for path in paths {
        let path = absolute(path);
        if let Some(contents) = files.files.get(&path) {
            entry(&mut archive, &path, Some(contents));
        } else if files.is_dir(&path) {
            let under = format!("{}/", path.trim_end_matches('/'));
            entry(&mut archive, &path, None);
            for dir in files.dirs.iter().filter(|d| d.starts_with(&under)) {
                entry(&mut archive, dir, None);
            }
            for (name, contents) in files.files.iter().filter(|(f, _)| f.starts_with(&under)) {
                entry(&mut archive, name, Some(contents));
            }
        } else {
            outcome.stderr.extend(
                format!(
                    "tar: {}: No such file or directory\n",
                    path.trim_start_matches('/')
                )
                .bytes(),
            );
            outcome.code = 2;
        }
    }
    archive.extend([0; 2 * BLOCK]);
    outcome.stdout = archive;
    outcome
}

/// One ustar header (and the contents, padded to a block) for a file or a directory.
fn entry(archive: &mut Vec<u8>, path: &str, contents: Option<&Vec<u8>>) {
    let mut name = path.trim_start_matches('/').to_owned();
    if contents.is_none() {
        name.push('/');
    }
    let mut header = [0u8; BLOCK];
    let (prefix, name) = split_name(&name);
    put(&mut header[0..100], name.as_bytes());
    let (mode, kind) = match contents {
        Some(_) => ("0000644", b'0'),
        None => ("0000755", b'5'),
    };
    put(&mut header[100..108], mode.as_bytes());
    put(&mut header[108..116], b"0000000");
    put(&mut header[116..124], b"0000000");
    let size = contents.map_or(0, Vec::len);
    put(&mut header[124..136], format!("{size:011o}").as_bytes());
    put(&mut header[136..148], b"00000000000");
    header[156] = kind;
    put(&mut header[257..263], b"ustar\0");
    put(&mut header[263..265], b"00");
    put(&mut header[345..500], prefix.as_bytes());
    header[148..156].fill(b' ');
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    put(&mut header[148..156], format!("{sum:06o}\0 ").as_bytes());
    archive.extend_from_slice(&header);
    if let Some(contents) = contents {
        archive.extend_from_slice(contents);
        archive.resize(archive.len().div_ceil(BLOCK) * BLOCK, 0);
    }
}

/// A name past ustar's 100 bytes goes partly into the 155-byte prefix, split at a `/`.
fn split_name(name: &str) -> (&str, &str) {
    if name.len() <= 100 {
        return ("", name);
    }
    let cut = name[..name.len().min(156)]
        .rfind('/')
        .filter(|&i| name.len() - i - 1 <= 100)
        .unwrap_or(0);
    (&name[..cut], &name[cut + 1..])
}

fn put(field: &mut [u8], value: &[u8]) {
    let n = value.len().min(field.len());
    field[..n].copy_from_slice(&value[..n]);
}

/// Unpacks ustar (and pax long names, as Go's archive/tar writes them) into `into`.
fn extract(archive: &[u8], into: &str, files: &mut Files) -> Outcome {
    if !files.is_dir(into) {
        return Outcome::fail(
            2,
            format!("tar: can't change directory to '{into}': No such file or directory"),
        );
    }
    let mut at = 0;
    let mut long_name: Option<String> = None;
    while at + BLOCK <= archive.len() {
        let header = &archive[at..at + BLOCK];
        if header.iter().all(|&b| b == 0) {
            break;
        }
        let Some(size) = octal(&header[124..136]) else {
            return Outcome::fail(2, "tar: invalid tar header (size)");
        };
        let body_end = at + BLOCK + size;
        if body_end > archive.len() {
            return Outcome::fail(2, "tar: short read: the archive ends inside a file");
        }
        let body = &archive[at + BLOCK..body_end];
        let text = |field: &[u8]| {
            let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            String::from_utf8_lossy(&field[..end]).into_owned()
        };
        let name = long_name.take().unwrap_or_else(|| {
            let prefix = text(&header[345..500]);
            let name = text(&header[0..100]);
            if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            }
        });
        match header[156] {
            b'x' => long_name = pax_path(body),
            b'L' => long_name = Some(text(body)),
            b'5' => {
                let mut dir = absolute(&format!("{into}/{name}"));
                while dir != "/" {
                    files.dirs.insert(dir.clone());
                    dir = parent(&dir);
                }
            }
            b'0' | 0 => files.write(&absolute(&format!("{into}/{name}")), body.to_vec()),
            // Links and the rest have no meaning in a stand-in file tree.
            _ => {}
        }
        at = at + BLOCK + size.div_ceil(BLOCK) * BLOCK;
    }
    Outcome::default()
}

fn octal(field: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    usize::from_str_radix(text, 8).ok()
}

/// The `path` record of a pax extended header (`LEN path=VALUE\n` records).
fn pax_path(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    text.lines().find_map(|record| {
        let (_, rest) = record.split_once(' ')?;
        rest.strip_prefix("path=").map(str::to_owned)
    })
}
