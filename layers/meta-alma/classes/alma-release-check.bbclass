# nooelint: oelint.bbclass.underscores - named like alma-fabric-check, the layer's other image check
# alma-release-check: fail a release rootfs (ALMA_RELEASE = "1") that anyone could log into
# without a key, that nobody could log into at all, or that ships one board's identity to all.
#
# The distro already strips debug-tweaks and friends for a release and alma-access installs
# the keys-only sshd drop-in; this re-checks the RESULT, so a package, feature or later
# config line that undoes any of it fails the build with the reason:
#   - root with an empty password; sshd's effective config (first value wins, Includes in
#     place, Match blocks too) allowing passwords, keyboard-interactive, empty passwords or root
#   - with admin access (ALMA_ADMIN_ACCESS != "0"): the admin user missing, with a password,
#     locked (sshd refuses even keys then), without a key, or not allowed to use sudo
#   - ssh host keys or a machine-id in the image (each board makes its own at first boot),
#     or host keys kept on a volatile /var/run (read-only rootfs: a new key every boot would
#     break the host key the fleet pinned)
alma_release_check[doc] = "Fail a release rootfs with password or root login, no admin key, or baked-in host identity"
# The paths below are the target's, as sshd, openssh's sshd_check_keys and oe-core's
# read_only_rootfs_hook spell them (Include patterns, /var/run/ssh), not build-time dirs.
# nooelint: oelint.vars.pathhardcode.localstatedir,oelint.vars.pathhardcode.sysconfdir
python alma_release_check() {
    import glob
    import os
    import re
    if d.getVar('ALMA_RELEASE') != '1':
        return
    rootfs = d.getVar('IMAGE_ROOTFS')
    etc = os.path.join(rootfs, d.getVar('sysconfdir').lstrip('/'))
    problems = []

    def read(path):
        try:
            with open(path, encoding='utf-8', errors='replace') as f:
                return f.read()
        except OSError:
            return None

    def table(name):
        text = read(os.path.join(etc, name)) or ''
        return {f[0]: f for f in (ln.split(':') for ln in text.splitlines()) if len(f) > 1}

    shadow = table('shadow')
    if 'root' in shadow and shadow['root'][1] == '':
        problems.append('shadow: root has an empty password')

    # sshd: the first value of a keyword wins; Include expands its globs (sorted) in place.
    def sshd_effective(path):
        first, in_match = {}, []
        def walk(p, depth):
            text = read(p)
            if text is None or depth > 8:
                return
            matching = False
            for raw in text.splitlines():
                line = raw.strip()
                if not line or line.startswith('#'):
                    continue
                parts = re.split(r'[\s=]+', line, maxsplit=1)
                kw, arg = parts[0].lower(), (parts[1].strip() if len(parts) > 1 else '')
                if kw == 'include':
                    for pat in arg.split():
                        pat = pat if pat.startswith('/') else '/etc/ssh/' + pat
                        for inc in sorted(glob.glob(os.path.join(rootfs, pat.lstrip('/')))):
                            walk(inc, depth + 1)
                    continue
                if kw == 'match':
                    matching = True
                    continue
                value = arg.split()[0].lower() if arg else ''
                if matching:
                    in_match.append((kw, value))
                elif kw not in first:
                    first[kw] = value
        walk(path, 0)
        return first, in_match

    want = {
        'passwordauthentication': ('no', 'yes', 'password login is on (PasswordAuthentication)'),
        'kbdinteractiveauthentication': ('no', 'yes', 'keyboard-interactive login is on (KbdInteractiveAuthentication)'),
        'permitrootlogin': ('no', 'prohibit-password', 'root login is allowed (PermitRootLogin)'),
        'permitemptypasswords': ('no', 'no', 'empty passwords are accepted (PermitEmptyPasswords)'),
        'pubkeyauthentication': ('yes', 'yes', 'key login is off (PubkeyAuthentication)'),
    }
    for name in ('sshd_config', 'sshd_config_readonly'):
        path = os.path.join(etc, 'ssh', name)
        if not os.path.exists(path):
            continue
        first, in_match = sshd_effective(path)
        if 'kbdinteractiveauthentication' not in first and 'challengeresponseauthentication' in first:
            first['kbdinteractiveauthentication'] = first['challengeresponseauthentication']
        for kw, (good, default, what) in want.items():
            if first.get(kw, default) != good:
                problems.append('ssh/%s: %s' % (name, what))
        for kw, value in in_match:
            if kw in want and value != want[kw][0]:
                problems.append('ssh/%s: a Match block sets %s %s' % (name, kw, value))

    user = d.getVar('ALMA_ADMIN_USER') or 'alma'
    if d.getVar('ALMA_ADMIN_ACCESS') != '0':
        passwd = table('passwd')
        if user not in passwd:
            problems.append('admin user %s is missing (no way in: add alma-access-admin, or set ALMA_ADMIN_ACCESS = "0" for a sealed image)' % user)
        else:
            pw = shadow.get(user, [user, '*'])[1]
            if pw == '':
                problems.append('shadow: %s has an empty password' % user)
            elif pw.startswith('!'):
                problems.append('shadow: %s is locked ("!"): sshd refuses even key logins for it' % user)
            elif pw != '*':
                problems.append('shadow: %s has a password; release images are keys only' % user)
            fields = passwd[user]
            home = fields[5] if len(fields) > 5 else '/home/' + user
            shell = fields[6] if len(fields) > 6 else ''
            if shell.endswith(('nologin', 'false')) or not shell:
                problems.append('passwd: %s has no login shell (%s)' % (user, shell or 'empty'))
            ak = os.path.join(rootfs, home.lstrip('/'), '.ssh', 'authorized_keys')
            key_re = re.compile(r'^(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa|sk-\S+@openssh\.com) [A-Za-z0-9+/]+={0,2}( \S+)?$')
            keys = [ln for ln in (read(ak) or '').splitlines() if key_re.match(ln.strip())]
            if not keys:
                problems.append('%s has no admin key in %s/.ssh/authorized_keys (build with alma build --admin-key FILE)' % (user, home))
            groups = table('group')
            members = groups.get('wheel', ['wheel', 'x', '', ''])[3].split(',') if len(groups.get('wheel', [])) > 3 else []
            sudoers = (read(os.path.join(etc, 'sudoers')) or '')
            dropin = read(os.path.join(etc, 'sudoers.d', '50-alma-admin')) or ''
            if user not in members or not re.search(r'^[@#]includedir\s+/etc/sudoers\.d\s*$', sudoers, re.MULTILINE) \
                    or not re.search(r'^%wheel\s', dropin, re.MULTILINE):
                problems.append('%s may not use sudo (group wheel, /etc/sudoers.d/50-alma-admin)' % user)

    hostkeys = sorted(os.path.basename(p) for p in glob.glob(os.path.join(etc, 'ssh', 'ssh_host_*key*')))
    if hostkeys:
        problems.append('ssh host keys are in the image (%s): every board would share them; '
                        'they are made on each board at first boot' % ', '.join(hostkeys))
    mid = read(os.path.join(etc, 'machine-id'))
    if mid is not None and mid.strip() not in ('', 'uninitialized'):
        problems.append('/etc/machine-id is set in the image: every board would share it')
    if re.search(r'sshd_config_readonly', read(os.path.join(etc, 'default', 'ssh')) or ''):
        problems.append('host keys live on volatile /var/run/ssh (read-only rootfs): a new key at every boot '
                        'would break the host key the fleet pinned')

    if problems:
        bb.fatal('alma-image: a release build (ALMA_RELEASE = "1") must be reachable with a key and only a key, '
                 'and carry no board identity: %s; build with kas/features/development.yml for a debug image'
                 % '; '.join(problems))
    bb.note('alma-release-check: keys-only sshd, admin access as configured, no baked-in host identity')
}
ROOTFS_POSTPROCESS_COMMAND += "alma_release_check"
ROOTFS_POSTPROCESS_COMMAND[vardeps] += "ALMA_RELEASE ALMA_ADMIN_ACCESS ALMA_ADMIN_USER"

# The CVE gate (kas/features/security.yml sets ALMA_CVE_GATE = "1"): a release rootfs fails on
# an Unpatched CVE with CVSS v3/v4 >= 9.0 in the image's cve-check report, which
# cve_check_write_rootfs_manifest (prepended to ROOTFS_POSTPROCESS_COMMAND) has written by
# now. A waiver is a CVE_STATUS with a reason in conf/distro/include/alma-cve-status.inc:
# cve-check reports it as Ignored, so it never reaches this list.
alma_cve_gate[doc] = "Fail a release rootfs with an unpatched critical CVE (CVSS >= 9.0) that no reviewed waiver covers"
python alma_cve_gate() {
    import json
    import os
    if d.getVar('ALMA_RELEASE') != '1' or d.getVar('ALMA_CVE_GATE') != '1':
        return
    report = d.getVar('CVE_CHECK_MANIFEST_JSON')
    if not report or not os.path.exists(report):
        bb.fatal('alma-image: ALMA_CVE_GATE is set but there is no cve-check report (%s): inherit cve-check' % report)
    with open(report, encoding='utf-8') as f:
        data = json.load(f)

    def score(value):
        try:
            return float(value)
        except (TypeError, ValueError):
            return 0.0

    def critical(issue):
        # the best CVSS version present (NVD writes "0.0" for a version it has no score of):
        # v4, else v3.x (>= 9.0 critical), else v2, which has no critical band: its "high"
        # (>= 7.0) counts (alma verify's rule, docs/verify.md "CVE severity")
        for version, limit in (('scorev4', 9.0), ('scorev3', 9.0), ('scorev2', 7.0)):
            if score(issue.get(version)) > 0.0:
                return score(issue.get(version)) >= limit
        return False

    critical_ids = []
    for pkg in data.get('package', []):
        for issue in pkg.get('issue', []):
            if issue.get('status') == 'Unpatched' and critical(issue):
                critical_ids.append('%s %s' % (pkg.get('name'), issue.get('id')))
    if critical_ids:
        bb.fatal('alma-image: a release must not ship an unpatched critical CVE (CVSS >= 9.0): %s; patch it, or '
                 'waive it with a reason in conf/distro/include/alma-cve-status.inc (CVE_STATUS, reviewed)'
                 % ', '.join(sorted(critical_ids)))
    bb.note('alma-cve-gate: no unpatched critical CVE in %s' % os.path.basename(report))
}
ROOTFS_POSTPROCESS_COMMAND += "alma_cve_gate"
ROOTFS_POSTPROCESS_COMMAND[vardeps] += "ALMA_CVE_GATE"
