# The block in docs/bridges.md: a Slack bridge over Socket Mode whose messages an approver approves on its own card.
{
  redis = { url = "redis://127.0.0.1:6390"; username = "cowboy-admin"; passwordFile = "/run/keys/cowboy-admin"; };
  agents.ann.passwordFile = "/run/keys/ann";
  bridges.slack = {
    type = "slack";
    secrets = { bot_token_file = "/run/keys/slack-bot"; app_token_file = "/run/keys/slack-app"; };
    destinations = [ "C0123ABCD" "C0456EFGH" ];   # cards go to notify_channel, so it must be here
    settings = { team_id = "T0123ABCD"; channels = [ "C0123ABCD" ]; };
    approval = { required = true; notify = "slack"; notify_channel = "C0456EFGH"; timeout = 3600; approvers = [ "slack:U0123ABCD" ]; };
  };
}
