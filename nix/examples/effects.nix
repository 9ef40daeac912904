# Render input for an effects bridge (the module builds `settings.actions`
# from `services.cowboy.bridges.deploy.actions`): an agent may publish the site
# at a commit it names, and a human approves each push by reacting on Discord.
# The agent commits in its own clone and pushes branches to the bare origin;
# `repo` is the operator's clone, whose config the agent cannot write.
{
  bridges.deploy = {
    type = "effects";
    approval = { notify = "discord"; notify_channel = "234567890123456789"; timeout = 3600; approvers = [ "discord:80351110224678912" ]; };
    settings.actions.publish-site = {
      repo = "/srv/site";
      command = [ "git" "-C" "/srv/site" "push" "origin" "{sha}:refs/heads/main" ];
      target = "origin/main";
      env = { PATH = "/run/current-system/sw/bin"; HOME = "/var/empty"; };
      timeout = 300;
    };
  };
  bridges.discord = {
    type = "discord";
    secrets.token_file = "/run/keys/discord-token";
    destinations = [ "123456789012345678" "234567890123456789" ];  # the cards' channel too
    settings = { channels = [ "234567890123456789" ]; };
  };
}
