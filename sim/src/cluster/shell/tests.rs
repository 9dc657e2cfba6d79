use super::*;

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

fn env() -> Vec<(String, String)> {
    vec![
        ("HOSTNAME".into(), "web-0".into()),
        ("MODE".into(), "fast".into()),
    ]
}

#[test]
fn commands_answer_as_a_busybox_shell_would() {
    let mut files = Files::new("web-0");
    let env = env();
    let mut cx = Context {
        files: &mut files,
        env: &env,
        size: None,
    };
    assert_eq!(
        run(&argv(&["echo", "hi", "there"]), &[], &mut cx).stdout,
        b"hi there\n"
    );
    assert_eq!(run(&argv(&["hostname"]), &[], &mut cx).stdout, b"web-0\n");
    assert_eq!(
        run(&argv(&["printenv", "MODE"]), &[], &mut cx).stdout,
        b"fast\n"
    );
    assert_eq!(
        run(&argv(&["cat", "/etc/hostname"]), &[], &mut cx).stdout,
        b"web-0\n"
    );
    assert_eq!(
        run(&argv(&["ls", "/"]), &[], &mut cx).stdout,
        b"app\netc\ntmp\n"
    );
    let missing = run(&argv(&["cat", "/nope"]), &[], &mut cx);
    assert_eq!(missing.code, 1);
    assert_eq!(
        missing.stderr,
        b"cat: can't open '/nope': No such file or directory\n"
    );
    assert_eq!(run(&argv(&["test", "-d", "/tmp"]), &[], &mut cx).code, 0);
    assert_eq!(
        run(&argv(&["test", "-d", "/etc/hostname"]), &[], &mut cx).code,
        1
    );
    let unknown = run(&argv(&["vim"]), &[], &mut cx);
    assert_eq!(
        (unknown.code, unknown.stderr),
        (127, b"sh: vim: not found\n".to_vec())
    );
}

#[test]
fn a_script_expands_variables_and_stops_at_exit() {
    let mut files = Files::new("web-0");
    let env = env();
    let mut cx = Context {
        files: &mut files,
        env: &env,
        size: None,
    };
    let out = run(
        &argv(&[
            "sh",
            "-c",
            "echo \"mode=$MODE\" '$MODE'; false && echo no; echo ${HOSTNAME}; exit 3; echo never",
        ]),
        &[],
        &mut cx,
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "mode=fast $MODE\nweb-0\n"
    );
    assert_eq!(out.code, 3);
}

#[test]
fn what_tar_writes_it_reads_back_elsewhere() {
    let mut files = Files::new("web-0");
    let env = env();
    let mut cx = Context {
        files: &mut files,
        env: &env,
        size: None,
    };
    let archive = run(&argv(&["tar", "cf", "-", "/etc"]), &[], &mut cx);
    assert_eq!(archive.code, 0);
    assert_eq!(archive.stdout.len() % 512, 0);
    run(&argv(&["mkdir", "-p", "/copy"]), &[], &mut cx);
    let unpacked = run(
        &argv(&["tar", "-xmf", "-", "-C", "/copy"]),
        &archive.stdout,
        &mut cx,
    );
    assert_eq!(
        unpacked.code,
        0,
        "{:?}",
        String::from_utf8_lossy(&unpacked.stderr)
    );
    assert_eq!(
        run(&argv(&["cat", "/copy/etc/hostname"]), &[], &mut cx).stdout,
        b"web-0\n"
    );
    let refused = run(
        &argv(&["tar", "-xmf", "-", "-C", "/absent"]),
        &archive.stdout,
        &mut cx,
    );
    assert_eq!(refused.code, 2);
}

#[test]
fn stty_size_reports_the_terminal_the_client_described() {
    let mut files = Files::new("web-0");
    let env = env();
    let mut cx = Context {
        files: &mut files,
        env: &env,
        size: None,
    };
    let no_tty = run(&argv(&["stty", "size"]), &[], &mut cx);
    assert_eq!(
        (no_tty.code, no_tty.stderr),
        (1, b"stty: standard input: Not a tty\n".to_vec())
    );
    cx.size = Some((132, 40));
    assert_eq!(
        run(&argv(&["stty", "size"]), &[], &mut cx).stdout,
        b"40 132\n"
    );
}
