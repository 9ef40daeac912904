# `mail` holds every message until someone approves it on `desk`.
{
  redis.url = "redis://127.0.0.1:6390";
  bridges.mail = {
    type = "console";
    destinations = [ "*@example.org" ];
    approval = { required = true; notify = "desk"; notify_channel = "ops"; timeout = 600; approvers = [ "console:boss" "cli:ann" ]; };
    settings = { output = "/var/lib/cowboy/mail.out"; input = "/var/lib/cowboy/mail.in"; };
  };
  bridges.desk = {
    type = "console";
    destinations = [ "ops" ];
    settings = { output = "/var/lib/cowboy/desk.out"; input = "/var/lib/cowboy/desk.in"; };
  };
}
