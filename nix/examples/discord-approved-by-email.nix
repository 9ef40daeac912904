# The block in docs/deployment.md: a Discord bridge whose messages are approved by email reply.
{
  redis = { url = "redis://127.0.0.1:6390"; username = "cowboy-admin"; passwordFile = "/run/keys/cowboy-admin"; };
  agents.ann.passwordFile = "/run/keys/ann";
  bridges.discord = {
    type = "discord";
    secrets.token_file = "/run/keys/discord-token";
    destinations = [ "123456789012345678" ];
    settings = { channels = [ "123456789012345678" ]; };
    approval = { required = true; notify = "email"; notify_channel = "ops@example.org"; timeout = 3600; approvers = [ "email:ops@example.org" ]; };
  };
  bridges.email = {
    type = "email";
    destinations = [ "ops@example.org" ];          # cards go to notify_channel, so it must be here
    secrets = { "smtp.password_file" = "/run/keys/smtp"; "imap.password_file" = "/run/keys/imap"; };
    settings = {
      from = "agents@example.org";
      smtp = { host = "mail.example.org"; port = 587; tls = "starttls"; username = "agents"; };
      imap = { host = "mail.example.org"; port = 993; tls = "implicit"; username = "agents"; };
    };
  };
}
