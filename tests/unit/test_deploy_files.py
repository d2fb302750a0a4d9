"""`diode deploy-files`: every file of deploy/ is shipped (the package's link to it), written
out byte for byte with where it goes, and an operator's edit is never overwritten silently."""

import pytest

from diode import deploy_files
from diode.errors import DiodeError
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"


def repo_files() -> dict:
    return {p.relative_to(DEPLOY).as_posix(): p.read_bytes()
            for p in sorted(DEPLOY.rglob("*")) if p.is_file()}


def test_every_file_of_deploy_is_shipped_and_has_a_place_on_a_host():
    shipped = deploy_files.shipped()
    assert shipped == repo_files()
    assert {"systemd/diode@.service", "sysctl.d/90-diode.conf", "grafana/diode.json"} <= \
        set(shipped)
    for name in shipped:  # a new kind of file is given its place here
        assert deploy_files.destination(name) != "see docs/deploy.md", name


def test_each_kind_of_file_is_said_where_it_goes():
    d = deploy_files.destination
    assert d("systemd/diode@.service") == ("install as /etc/systemd/system/diode@.service, "
                                           "then systemctl daemon-reload")
    assert d("sysctl.d/90-diode.conf") == ("install as /etc/sysctl.d/90-diode.conf, then "
                                           "sysctl --system")
    assert d("prometheus/diode-rules.yml") == (
        "install as /etc/prometheus/diode-rules.yml (named in prometheus.yml's rule_files), "
        "then promtool check rules /etc/prometheus/diode-rules.yml")
    assert d("prometheus/diode-rules.test.yml", "/srv/x/prometheus/diode-rules.test.yml") == (
        "not installed: Prometheus' unit tests of the rules beside it, then promtool test "
        "rules /srv/x/prometheus/diode-rules.test.yml")
    assert d("grafana/diode.json").startswith("import it into Grafana")


def test_written_out_as_shipped_an_edit_kept_unless_forced(tmp_path):
    done = deploy_files.write(tmp_path)
    written = {p.relative_to(tmp_path).as_posix(): p.read_bytes()
               for p in tmp_path.rglob("*") if p.is_file()}
    assert written == repo_files()
    assert {what for _, what in done} == {"written"}
    assert {what for _, what in deploy_files.write(tmp_path)} == {"unchanged"}

    edited = tmp_path / "sysctl.d" / "90-diode.conf"
    edited.write_text(edited.read_text() + "net.core.rmem_max = 268435456\n")
    gone = tmp_path / "systemd" / "diode@.service"
    gone.unlink()
    with pytest.raises(DiodeError, match="90-diode.conf: differ from the shipped file.*"
                       "nothing written. --force replaces them"):
        deploy_files.write(tmp_path)
    assert "268435456" in edited.read_text() and not gone.exists()  # nothing written

    done = dict(deploy_files.write(tmp_path, force=True))
    assert done[str(edited)] == "replaced" and done[str(gone)] == "written"
    assert edited.read_bytes() == (DEPLOY / "sysctl.d" / "90-diode.conf").read_bytes()
    assert gone.stat().st_mode & 0o777 == 0o644
