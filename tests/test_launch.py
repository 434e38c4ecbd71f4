import tomllib

from server.launch import main, make_certs


def test_connect_writes_flower_connections(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert main(["connect", "sim", "--simulation", "--num-supernodes", "8", "--client-gpus", "0.25"]) == 0
    assert main(["connect", "lab", "--address", "10.1.2.3:8000", "--insecure"]) == 0
    assert main(["connect", "nossl", "--address", "10.1.2.3:8000"]) == 2  # neither TLS nor --insecure
    cfg = tomllib.loads((tmp_path / "config.toml").read_text())["superlink"]
    assert cfg["sim"]["address"] == ":local:" and cfg["sim"]["options"]["num-supernodes"] == 8
    assert cfg["sim"]["options"]["backend"]["client-resources"] == {"num-cpus": 1, "num-gpus": 0.25}
    assert cfg["lab"] == {"address": "10.1.2.3:8000", "insecure": True} and "nossl" not in cfg


def test_launch_commands_carry_ports_tls_and_node_config(capsys, tmp_path):
    main(["superlink", "--certs", str(tmp_path), "--fleet-port", "9192", "--dry-run"])
    line = capsys.readouterr().out
    assert "--fleet-api-address 0.0.0.0:9192" in line and f"--ssl-certfile {tmp_path}/server.crt" in line and "--insecure" not in line
    main(["supernode", "--superlink", "srv:9092", "--partition-id", "3", "--num-partitions", "8", "--body", "mlp", "--insecure", "--dry-run"])
    line = capsys.readouterr().out
    assert "--node-config partition-id=3 num-partitions=8 body='mlp'" in line and "--superlink srv:9092" in line


def test_certificates_chain_to_the_ca(tmp_path):
    from cryptography import x509

    make_certs(tmp_path, "10.0.0.5")
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    srv = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    srv.verify_directly_issued_by(ca)
    names = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.0.0.5" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
