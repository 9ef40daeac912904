# NixOS VM test, in the style of nixpkgs' nixos/tests: two console bridges, one
# needing approval through the other, every service on its own ACL user.
# Run with: nix build ./nix#checks.x86_64-linux.vm
{ self }:
{ pkgs, ... }:
{
  name = "cowboy";

  nodes.machine = { pkgs, ... }: {
    imports = [ self.nixosModules.default ];
    environment.etc = builtins.listToAttrs (map (u: { name = "cowboy-secrets/${u}"; value = { text = "pw-${u}\n"; mode = "0400"; }; })
      [ "admin" "ann" "mail-ingest" "mail-outbox" "mail-ping" "desk-ingest" "desk-outbox" "desk-ping" ]);
    services.cowboy = {
      enable = true;
      redis.operatorPasswordFile = "/etc/cowboy-secrets/admin";
      agents.ann.passwordFile = "/etc/cowboy-secrets/ann";
      bridges = {
        mail = {
          type = "console";
          destinations = [ "*@example.org" ];
          approval = { required = true; notify = "desk"; notify_channel = "ops"; timeout = 600; approvers = [ "cli:root" ]; };
          settings = { output = "/var/lib/cowboy/mail.out"; input = "/var/lib/cowboy/mail.in"; };
          redisPasswordFiles = { ingest = "/etc/cowboy-secrets/mail-ingest"; outbox = "/etc/cowboy-secrets/mail-outbox"; ping = "/etc/cowboy-secrets/mail-ping"; };
        };
        desk = {
          type = "console";
          destinations = [ "ops" ];
          settings = { output = "/var/lib/cowboy/desk.out"; input = "/var/lib/cowboy/desk.in"; };
          redisPasswordFiles = { ingest = "/etc/cowboy-secrets/desk-ingest"; outbox = "/etc/cowboy-secrets/desk-outbox"; ping = "/etc/cowboy-secrets/desk-ping"; };
        };
      };
    };
  };

  testScript = ''
    machine.wait_for_unit("cowboy.target")
    for unit in ["cowboy-mail-outbox", "cowboy-desk-outbox", "cowboy-desk-ingest", "cowboy-mail-ping"]:
        machine.wait_for_unit(unit + ".service")
    machine.succeed("cowboy acl check")
    machine.fail("redis-cli -p 6390 ping | grep PONG")  # the default user is off
    machine.succeed("cowboy send --bridge mail --agent ann --channel bob@example.org --content 'hello from the VM'")
    machine.wait_until_succeeds("grep -q approval_id /var/lib/cowboy/desk.out")
    approval = machine.succeed("cowboy approvals list | cut -d' ' -f1").strip()
    machine.succeed(f"cowboy approvals approve {approval[:8]} --as root")
    machine.wait_until_succeeds("grep -q 'hello from the VM' /var/lib/cowboy/mail.out")
    machine.succeed("systemctl kill -s TERM cowboy-mail-outbox.service")
    machine.wait_for_unit("cowboy-mail-outbox.service")
  '';
}
